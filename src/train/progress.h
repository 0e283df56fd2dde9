// What a person watching a run sees. On a terminal: one progress line rewritten in place
// (step, loss, tokens/s, ETA); elsewhere (a log file, CI): plain lines, one per update. Messages
// (evaluations, checkpoints) print on their own lines either way, and every line also goes to the
// run's train.log.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>

namespace tessera {

class Progress {
 public:
  // echo = false writes the log file only (ranks other than 0 of a multi-process run).
  Progress(int64_t total_steps, const std::string& log_path, bool append, bool echo = true);
  ~Progress();

  void update(int64_t step, double loss, double tokens_per_s, double seconds_per_step);
  void message(const std::string& line);

 private:
  void clear_line();
  int64_t total_steps_;
  bool tty_;
  bool echo_;
  bool line_open_ = false;
  std::ofstream log_;
};

std::string format_duration(double seconds);  // "42s", "3m05s", "2h10m"

}  // namespace tessera
