// Heartbeats through the rendezvous store (heartbeat.h).
#include "comm/heartbeat.h"

#include <vector>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "core/error.h"

namespace tessera::comm {
namespace {

std::string key(int64_t rank) { return "tessera/heartbeat/" + std::to_string(rank); }

}  // namespace

Heartbeat::Heartbeat(const std::string& host, uint16_t port, int64_t rank, int64_t world, std::string store_owner)
    : rank_(rank), world_(world), store_owner_(std::move(store_owner)) {
  c10d::TCPStoreOptions options;
  options.port = port;
  options.isServer = false;
  options.waitWorkers = false;
  options.timeout = kHeartbeatStoreTimeout;
  try {
    store_ = c10::make_intrusive<c10d::TCPStore>(host, options);
  } catch (const std::exception& e) {
    fail("rank ", rank, ": the heartbeat cannot reach the rendezvous store at ", host, ":", port, ": ", e.what());
  }
  thread_ = std::thread([this] { beat(); });
}

Heartbeat::~Heartbeat() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  stop_cv_.notify_all();
  thread_.join();
}

void Heartbeat::beat() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    lock.unlock();
    try {
      std::lock_guard<std::mutex> store_lock(store_mutex_);
      store_->add(key(rank_), 1);
    } catch (const std::exception&) {
      // The store is silent; diagnose() reports it. Keep trying: it may come back.
    }
    lock.lock();
    stop_cv_.wait_for(lock, kHeartbeatInterval, [this] { return stopping_; });
  }
}

std::string Heartbeat::diagnose() {
  auto read_all = [this]() {
    std::vector<int64_t> counts(static_cast<size_t>(world_));
    std::lock_guard<std::mutex> store_lock(store_mutex_);
    for (int64_t r = 0; r < world_; ++r) counts[static_cast<size_t>(r)] = store_->add(key(r), 0);
    return counts;
  };
  std::vector<int64_t> before, after;
  try {
    before = read_all();
    std::this_thread::sleep_for(kSilenceWindow);
    after = read_all();
  } catch (const std::exception&) {
    return "the rendezvous store (" + store_owner_ + ") does not answer: that process is stopped, hung or cut off";
  }
  std::string silent;
  int64_t count = 0;
  for (int64_t r = 0; r < world_; ++r)
    if (after[static_cast<size_t>(r)] == before[static_cast<size_t>(r)]) {
      silent += (silent.empty() ? "" : ", ") + std::to_string(r);
      ++count;
    }
  const auto seconds = std::to_string(kSilenceWindow.count() / 1000);
  if (count == 0)
    return "every rank's heartbeat is alive: the ranks run, but did not all enter this operation (a rank may be "
           "blocked elsewhere, or the ranks issued different collectives)";
  return (count == 1 ? "rank " : "ranks ") + silent + " sent no heartbeat for " + seconds + " s: " +
         (count == 1 ? "it is" : "they are") + " stopped, hung, dead or cut off";
}

}  // namespace tessera::comm
