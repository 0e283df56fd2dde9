// Which rank to blame when a collective fails. Without it, a rank that stopped (SIGSTOP, a hung
// host, a cut network) is never named: the ranks that time out waiting for it report their own
// failure, and the launcher blames the first of them to exit.
//
// Every rank of a multi-process mesh runs a heartbeat thread that increments the store key
// "tessera/heartbeat/<rank>" once per second, through a store client of its own with a short
// timeout (kHeartbeatStoreTimeout), so that a silent store cannot hang it. A stopped or dead
// process stops beating.
//
// diagnose() (called once, when a group's operation fails) names the ranks whose counter did not
// move over a window of at least kMinSilence; when the store itself does not answer it says so,
// naming where the store lives (rank 0's process, or torchrun's agent). The window's first reading
// is taken ahead of the failure where it can be: watch(timeout) has the heartbeat thread read every
// rank's counter once an operation of this process (the flight recorder's) has run for
// timeout - kSilenceWindow, so diagnose() at the timeout compares against it at once and the
// failure is reported at parallel.timeout_s, not kSilenceWindow later. Without such a reading (no
// operation near its timeout, or one older than kStaleReading), or where every rank beat since it
// (one may have stopped after it), it reads twice, kSilenceWindow apart.
// One reading per stuck operation: the counters are read only when an operation is near its end.
// A stop request (interrupt_diagnoses(): the worker's SIGTERM or SIGINT handler, as the launcher
// sends SIGTERM to every rank once one failed) ends a window being waited: diagnose() then says it
// was stopped, naming no rank from a window too short to judge, so the failure and its flight
// record are written at once instead of after the launcher's grace.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <c10/util/intrusive_ptr.h>

namespace c10d {
class Store;
}

namespace tessera::comm {

constexpr std::chrono::milliseconds kHeartbeatInterval{1000};
constexpr std::chrono::milliseconds kHeartbeatStoreTimeout{3000};
constexpr std::chrono::milliseconds kSilenceWindow{3000};
constexpr std::chrono::milliseconds kMinSilence{2000};    // two beats: a live rank moved in it
constexpr std::chrono::milliseconds kStaleReading{6000};  // older: a rank may have died since

// Async-signal-safe (one atomic store): every diagnose() of this process stops waiting.
void interrupt_diagnoses();

class Heartbeat {
 public:
  // Connects its own client to the store at host:port (throws naming it when it cannot) and starts
  // beating. `store_owner` names where the store lives, for diagnose().
  Heartbeat(const std::string& host, uint16_t port, int64_t rank, int64_t world, std::string store_owner);
  ~Heartbeat();
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  // Reads the counters ahead of a timeout (above); `timeout` is the groups' (parallel.timeout_s).
  void watch(std::chrono::milliseconds timeout);

  // "rank 2 sent no heartbeat for 2.6 s: it is stopped, hung or cut off", or what else was seen.
  std::string diagnose();

 private:
  void beat();
  std::vector<int64_t> read_all();  // every rank's counter (throws when the store does not answer)
  void read_ahead_of_timeout();      // the beat thread's watch
  c10::intrusive_ptr<c10d::Store> store_;
  std::mutex store_mutex_;  // one client, two threads
  int64_t rank_, world_;
  std::string store_owner_;
  std::mutex mutex_;  // guards what follows
  std::condition_variable stop_cv_;
  bool stopping_ = false;
  std::chrono::milliseconds watch_{0};        // 0: not watching
  double watched_start_ = 0;                  // the operation the last reading was taken for
  std::vector<int64_t> reading_;              // that reading, and when
  std::chrono::steady_clock::time_point read_at_;
  std::thread thread_;
};

}  // namespace tessera::comm
