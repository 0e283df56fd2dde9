// Signal-driven stop requests (stop_request.h).
#include "train/stop_request.h"

#include <signal.h>

#include <time.h>

#include <atomic>
#include <cstring>
#include <sstream>

#include "comm/heartbeat.h"

namespace tessera::stop_request {
namespace {

std::atomic<int> g_signal{0};
std::atomic<int64_t> g_first_ns{0};

int64_t monotonic_ns() {  // clock_gettime is async-signal-safe
  timespec t{};
  ::clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<int64_t>(t.tv_sec) * 1000000000 + t.tv_nsec;
}

void on_stop_signal(int sig) {
  comm::interrupt_diagnoses();  // a failed operation's diagnosis must not outwait the launcher's grace
  int expected = 0;
  if (g_signal.compare_exchange_strong(expected, sig)) {
    g_first_ns = monotonic_ns();
  } else if (monotonic_ns() - g_first_ns.load() >= 2000000000) {
    ::signal(sig, SIG_DFL);  // a second request: stop at once
    ::raise(sig);
  }
}

}  // namespace

void install() {
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
}

Reason local_reason(double elapsed_s, double time_limit_s) {
  if (g_signal.load() != 0) return kSignal;
  if (time_limit_s > 0 && elapsed_s >= time_limit_s) return kTimeLimit;
  return kNone;
}

std::string describe(Reason reason, double time_limit_s) {
  std::ostringstream out;
  if (reason == kSignal) {
    const int sig = g_signal.load();
    const char* name = sig ? sigabbrev_np(sig) : nullptr;
    out << (name ? "SIG" + std::string(name) + " received" : std::string("a stop signal received by another rank"));
  } else if (reason == kTimeLimit) {
    out << "train.time_limit = " << time_limit_s << " s reached";
  }
  return out.str();
}

}  // namespace tessera::stop_request
