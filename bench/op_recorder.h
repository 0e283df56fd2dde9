// OpRecorder: every ATen op and autograd node run while it lives, on any thread, timed through
// at::RecordFunction: calls, self time (its own time minus that of the ops it called) and total
// time per op name. For the benchmark programs that say where a step's time goes
// (bench/profile_step.cpp, bench/split_profile.cpp).
//
// Invariants: one OpRecorder at a time (the callback and its table are the process's); an op entered
// before the recorder was made is not counted; take() returns what was recorded since the last
// take() and clears it.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include <ATen/record_function.h>

namespace tessera::bench {

struct OpStat {
  int64_t calls = 0;
  double self_us = 0, total_us = 0;
};

class OpRecorder {
 public:
  OpRecorder();
  ~OpRecorder();
  OpRecorder(const OpRecorder&) = delete;
  OpRecorder& operator=(const OpRecorder&) = delete;

  std::map<std::string, OpStat> take();

 private:
  at::CallbackHandle handle_;
};

}  // namespace tessera::bench
