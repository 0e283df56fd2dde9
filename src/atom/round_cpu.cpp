// The CPU of an averaging round per byte sent, measured in one process (round_cpu.h).
#include "atom/round_cpu.h"

#include <time.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>

#include "atom/averaging.h"
#include "atom/wire.h"
#include "core/error.h"

namespace tessera::atom {
namespace {

double process_cpu_s() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// One member: its listener serves the channels the others open to it (as a peer's does).
struct Member {
  std::string id;
  std::unique_ptr<Averager> averager;
  std::unique_ptr<Listener> listener;
  RoundClock clock{5, 60};
  Member(const SwarmKey& key, std::string name, size_t max_bytes) : id(std::move(name)) {
    listener = std::make_unique<Listener>(
        "127.0.0.1", 0, key, id, max_bytes,
        [this](std::unique_ptr<Channel> c) { averager->serve(*c, c->receive(Deadline::in(30))); }, nullptr);
    averager = std::make_unique<Averager>(key, id, address(), max_bytes, AggregationRule{}, /*ring=*/true);
  }
  ~Member() { averager->close(); }  // before the listener stops
  std::string address() const { return "127.0.0.1:" + std::to_string(listener->port()); }
};

// Round `round` on every member at once; the bytes they sent.
uint64_t run_round(std::vector<std::unique_ptr<Member>>& members, int64_t round, const std::vector<at::Tensor>& vectors) {
  std::vector<RoundMember> candidates;
  for (const auto& m : members) candidates.push_back({m->id, m->address()});
  std::vector<RoundResult> results(members.size());
  std::vector<std::string> errors(members.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < members.size(); ++i)
    threads.emplace_back([&, i] {
      try {
        results[i] = members[i]->averager->run_round(round, candidates, vectors[i], 1.0, PartEncoding{}, members[i]->clock);
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
    });
  for (std::thread& t : threads) t.join();
  uint64_t sent = 0;
  for (size_t i = 0; i < members.size(); ++i) {
    require(errors[i].empty(), "measuring a round's CPU: member ", members[i]->id, "'s round failed: ", errors[i]);
    sent += results[i].bytes_sent;
  }
  return sent;
}

}  // namespace

double round_cpu_ns_per_byte(int64_t members, int64_t elements, double seconds) {
  require(members >= 2 && elements > 0, "round_cpu_ns_per_byte: needs two or more members and a vector");
  const SwarmKey key = SwarmKey::from_bytes(random_bytes(32));
  const size_t max_bytes = static_cast<size_t>(elements) * 8 + (1 << 20);
  std::vector<std::unique_ptr<Member>> peers;
  std::vector<at::Tensor> vectors;
  for (int64_t i = 0; i < members; ++i) {
    peers.push_back(std::make_unique<Member>(key, "member" + std::to_string(i), max_bytes));
    vectors.push_back(at::randn({elements}));
  }
  run_round(peers, 0, vectors);  // opens the channels the rounds below keep
  const double cpu0 = process_cpu_s();
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  uint64_t sent = 0;
  for (int64_t round = 1; round <= 2 || std::chrono::steady_clock::now() < until; ++round)
    sent += run_round(peers, round, vectors);
  return 1e9 * (process_cpu_s() - cpu0) / static_cast<double>(sent);
}

}  // namespace tessera::atom
