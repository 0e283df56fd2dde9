#include "train/progress.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <iostream>

namespace tessera {

Progress::Progress(int64_t total_steps, const std::string& log_path, bool append, bool echo)
    : total_steps_(total_steps), tty_(::isatty(STDOUT_FILENO) != 0), echo_(echo),
      log_(log_path, append ? std::ios::app : std::ios::trunc) {}

Progress::~Progress() { clear_line(); }

void Progress::clear_line() {
  if (line_open_) {
    std::cout << "\n" << std::flush;
    line_open_ = false;
  }
}

void Progress::update(int64_t step, double loss, double tokens_per_s, double seconds_per_step) {
  char text[256];
  double eta = seconds_per_step * static_cast<double>(total_steps_ - step);
  std::snprintf(text, sizeof(text), "step %lld/%lld | loss %.4f | %.0f tok/s | ETA %s", static_cast<long long>(step),
                static_cast<long long>(total_steps_), loss, tokens_per_s, format_duration(eta).c_str());
  log_ << text << "\n" << std::flush;
  if (!echo_) return;
  if (tty_) {
    int width = 28;
    int filled = static_cast<int>(width * step / std::max<int64_t>(total_steps_, 1));
    std::cout << "\r\033[K[" << std::string(filled, '#') << std::string(width - filled, '.') << "] " << text << std::flush;
    line_open_ = true;
  } else {
    std::cout << text << "\n" << std::flush;
  }
}

void Progress::message(const std::string& line) {
  clear_line();
  if (echo_) std::cout << line << "\n" << std::flush;
  log_ << line << "\n" << std::flush;
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  char text[32];
  auto s = static_cast<long long>(seconds + 0.5);
  if (s < 60) std::snprintf(text, sizeof(text), "%llds", s);
  else if (s < 3600) std::snprintf(text, sizeof(text), "%lldm%02llds", s / 60, s % 60);
  else std::snprintf(text, sizeof(text), "%lldh%02lldm", s / 3600, (s % 3600) / 60);
  return text;
}

}  // namespace tessera
