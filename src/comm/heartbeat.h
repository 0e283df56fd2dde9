// Which rank to blame when a collective fails. Without it, a rank that stopped (SIGSTOP, a hung
// host, a cut network) is never named: the ranks that time out waiting for it report their own
// failure, and the launcher blames the first of them to exit.
//
// Every rank of a multi-process mesh runs a heartbeat thread that increments the store key
// "tessera/heartbeat/<rank>" once per second, through a store client of its own with a short
// timeout (kHeartbeatStoreTimeout), so that a silent store cannot hang it. A stopped or dead
// process stops beating.
//
// diagnose() (called once, when a group's operation fails) reads every rank's counter twice,
// kSilenceWindow apart, and names the ranks whose counter did not move; when the store itself does
// not answer it says so, naming where the store lives (rank 0's process, or torchrun's agent).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

#include <c10/util/intrusive_ptr.h>

namespace c10d {
class Store;
}

namespace tessera::comm {

constexpr std::chrono::milliseconds kHeartbeatInterval{1000};
constexpr std::chrono::milliseconds kHeartbeatStoreTimeout{3000};
constexpr std::chrono::milliseconds kSilenceWindow{3000};

class Heartbeat {
 public:
  // Connects its own client to the store at host:port (throws naming it when it cannot) and starts
  // beating. `store_owner` names where the store lives, for diagnose().
  Heartbeat(const std::string& host, uint16_t port, int64_t rank, int64_t world, std::string store_owner);
  ~Heartbeat();
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  // "rank 2 sent no heartbeat for 3 s: it is stopped, hung or cut off", or what else was seen.
  std::string diagnose();

 private:
  void beat();
  c10::intrusive_ptr<c10d::Store> store_;
  std::mutex store_mutex_;  // one client, two threads
  int64_t rank_, world_;
  std::string store_owner_;
  std::mutex mutex_;
  std::condition_variable stop_cv_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace tessera::comm
