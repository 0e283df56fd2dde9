// Heartbeats through the rendezvous store (heartbeat.h).
#include "comm/heartbeat.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <vector>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "comm/flight_recorder.h"
#include "core/error.h"

namespace tessera::comm {
namespace {

std::string key(int64_t rank) { return "tessera/heartbeat/" + std::to_string(rank); }

std::atomic<bool> g_interrupted{false};  // interrupt_diagnoses()

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

void Heartbeat::watch(std::chrono::milliseconds timeout) {
  std::lock_guard<std::mutex> lock(mutex_);
  watch_ = timeout;
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
    read_ahead_of_timeout();
    lock.lock();
    stop_cv_.wait_for(lock, kHeartbeatInterval, [this] { return stopping_; });
  }
}

std::vector<int64_t> Heartbeat::read_all() {
  std::vector<int64_t> counts(static_cast<size_t>(world_));
  std::lock_guard<std::mutex> store_lock(store_mutex_);
  for (int64_t r = 0; r < world_; ++r) counts[static_cast<size_t>(r)] = store_->add(key(r), 0);
  return counts;
}

void Heartbeat::read_ahead_of_timeout() {
  double watched;
  std::chrono::milliseconds watch;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    watch = watch_;
    watched = watched_start_;
  }
  if (watch.count() <= 0) return;
  const double oldest = oldest_running_flight_start();
  if (oldest <= 0 || oldest == watched) return;
  const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  const double ran = now - oldest;
  if (ran < std::chrono::duration<double>(watch - kSilenceWindow).count()) return;
  std::vector<int64_t> counts;
  try {
    counts = read_all();
  } catch (const std::exception&) {
    return;  // the store is silent: diagnose() finds it so
  }
  std::lock_guard<std::mutex> lock(mutex_);
  reading_ = std::move(counts);
  read_at_ = std::chrono::steady_clock::now();
  watched_start_ = oldest;
}

void interrupt_diagnoses() { g_interrupted.store(true); }

std::string Heartbeat::diagnose() {
  using Clock = std::chrono::steady_clock;
  // Sleeps until `until` or a stop request; false when stopped.
  auto wait_until = [](Clock::time_point until) {
    while (Clock::now() < until) {
      if (g_interrupted.load()) return false;
      std::this_thread::sleep_for(std::min<Clock::duration>(std::chrono::milliseconds(50), until - Clock::now()));
    }
    return !g_interrupted.load();
  };
  const std::string stopped =
      "this rank was stopped (a stop signal: the launcher stops every rank once one failed) before the heartbeats "
      "could name a silent rank";
  std::vector<int64_t> early;
  Clock::time_point early_at;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    early = reading_;
    early_at = read_at_;
  }
  // The ranks whose counter did not move from `before` (read at `at`) to now, and the window.
  struct Verdict {
    std::string silent;
    int64_t count = 0;
    double window = 0;
  };
  auto silent_since = [this](const std::vector<int64_t>& before, Clock::time_point at) {
    const std::vector<int64_t> after = read_all();
    Verdict v;
    v.window = std::chrono::duration<double>(Clock::now() - at).count();
    for (int64_t r = 0; r < world_; ++r)
      if (after[static_cast<size_t>(r)] == before[static_cast<size_t>(r)]) {
        v.silent += (v.silent.empty() ? "" : ", ") + std::to_string(r);
        ++v.count;
      }
    return v;
  };
  Verdict v;
  try {
    if (!early.empty() && Clock::now() - early_at <= kStaleReading) {
      if (!wait_until(early_at + kMinSilence)) return stopped;
      v = silent_since(early, early_at);
    }
    // No reading ahead, or every rank beat since it (one may have stopped after it): a window now.
    if (v.count == 0) {
      const std::vector<int64_t> before = read_all();
      const Clock::time_point at = Clock::now();
      if (!wait_until(at + kSilenceWindow)) return stopped;
      v = silent_since(before, at);
    }
  } catch (const std::exception&) {
    return "the rendezvous store (" + store_owner_ + ") does not answer: that process is stopped, hung or cut off";
  }
  if (v.count == 0)
    return "every rank's heartbeat is alive: the ranks run, but did not all enter this operation (a rank may be "
           "blocked elsewhere, or the ranks issued different collectives)";
  char seconds[32];
  std::snprintf(seconds, sizeof seconds, "%.1f", v.window);
  return (v.count == 1 ? "rank " : "ranks ") + v.silent + " sent no heartbeat for " + seconds + " s: " +
         (v.count == 1 ? "it is" : "they are") + " stopped, hung, dead or cut off";
}

}  // namespace tessera::comm
