#include "op_recorder.h"

#include <chrono>
#include <mutex>
#include <utility>
#include <vector>

namespace tessera::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct Frame {
  std::string name;
  Clock::time_point start;
  double child_us = 0;
};

std::mutex stats_mutex;
std::map<std::string, OpStat> stats;
thread_local std::vector<Frame> frames;

std::unique_ptr<at::ObserverContext> on_enter(const at::RecordFunction& fn) {
  frames.push_back({fn.name(), Clock::now(), 0.0});
  return nullptr;
}

void on_exit(const at::RecordFunction&, at::ObserverContext*) {
  if (frames.empty()) return;  // entered before the callback was added
  Frame f = std::move(frames.back());
  frames.pop_back();
  const double total = std::chrono::duration<double, std::micro>(Clock::now() - f.start).count();
  if (!frames.empty()) frames.back().child_us += total;
  std::lock_guard<std::mutex> lock(stats_mutex);
  OpStat& s = stats[f.name];
  s.calls += 1;
  s.self_us += total - f.child_us;
  s.total_us += total;
}

}  // namespace

OpRecorder::OpRecorder()
    : handle_(at::addGlobalCallback(
          at::RecordFunctionCallback(on_enter, on_exit)
              .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION, at::RecordScope::USER_SCOPE}))) {}

OpRecorder::~OpRecorder() { at::removeCallback(handle_); }

std::map<std::string, OpStat> OpRecorder::take() {
  std::lock_guard<std::mutex> lock(stats_mutex);
  return std::exchange(stats, {});
}

}  // namespace tessera::bench
