// Timing, fitting and the host's own measurements for `tessera plan calibrate` (calibrate.h, the
// machine's and the card's files alike): each measured point is the median
// of repeated runs, points timed in turn over rounds, and lines fitted by Theil and Sen. An op that
// runs on a GPU synchronizes inside itself, so its time is the device's (plus one synchronization,
// which a fit's intercept takes up).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include <c10/core/Device.h>

namespace tessera::plan::calibration {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The times of `op` run repeatedly for about `budget` seconds, at least 5 times (after one warm-up
// run).
template <class Op>
std::vector<double> timed_runs(Op&& op, double budget) {
  op();
  std::vector<double> times;
  const Clock::time_point start = Clock::now();
  while (times.size() < 5 || (seconds_since(start) < budget && times.size() < 10000)) {
    const Clock::time_point t = Clock::now();
    op();
    times.push_back(seconds_since(t));
  }
  return times;
}

inline double median(std::vector<double> values) {
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(values.size() / 2), values.end());
  return values[values.size() / 2];
}

// The median time of `op`: what a step's kernels take as they run, interference included.
template <class Op>
double median_seconds(Op&& op, double budget) {
  return median(timed_runs(op, budget));
}

// The median time of each of `ops`, the ops timed in turn over three rounds (the budget shared
// between them) and each one's runs of every round pooled: a while when another process holds the
// core falls on one round of each op rather than on every run of one, which would bend the fit
// across sizes.
inline std::vector<double> medians_in_rounds(const std::vector<std::function<void()>>& ops, double budget) {
  constexpr int kRounds = 3;
  std::vector<std::vector<double>> runs(ops.size());
  for (int round = 0; round < kRounds; ++round)
    for (size_t i = 0; i < ops.size(); ++i) {
      const std::vector<double> times = timed_runs(ops[i], budget / kRounds);
      runs[i].insert(runs[i].end(), times.begin(), times.end());
    }
  std::vector<double> medians;
  for (std::vector<double>& times : runs) medians.push_back(median(std::move(times)));
  return medians;
}

// y = a + b x by Theil and Sen: b the median of the slopes between every two points, a the median
// of y - b x. One point measured while another process held the core moves it little, where it
// can turn a least-squares slope negative.
inline std::pair<double, double> fit_line(const std::vector<double>& x, const std::vector<double>& y) {
  std::vector<double> slopes, intercepts;
  for (size_t i = 0; i < x.size(); ++i)
    for (size_t j = i + 1; j < x.size(); ++j)
      if (x[j] != x[i]) slopes.push_back((y[j] - y[i]) / (x[j] - x[i]));
  const double b = median(std::move(slopes));
  for (size_t i = 0; i < x.size(); ++i) intercepts.push_back(y[i] - b * x[i]);
  return {median(std::move(intercepts)), b};
}

// tessera's AdamW on the host over `elements` float32 elements with a fresh gradient, on the
// threads this process runs, its median time as bytes per second counted as the planner counts
// them (28 per element: plan/cost_model.h's optimizer_bytes_per_element). calibrate.cpp.
double adamw_host_gbs(int64_t elements, double budget);

// A step's small kernels through autograd: a chain of 32 adds on 8 elements on `device`, forward
// and backward (64 kernels a run), its median time per kernel in microseconds; `synchronize`
// (a card's) ends each run. calibrate.cpp.
double autograd_kernel_us(c10::Device device, double budget, const std::function<void()>& synchronize = {});

// The activation codec `codec` (memory/activation_codec.h) encoding and decoding `activation` as the
// pack and unpack hooks run it: the median seconds; `synchronize` (a card's) ends each run.
// calibrate.cpp.
double activation_codec_seconds(const at::Tensor& activation, const std::string& codec, double budget,
                                const std::function<void()>& synchronize = {});
// The same on [16384, 512] float32 on `device` (32 MiB), as source bytes per second (GB/s).
double activation_codec_gbs(const std::string& codec, c10::Device device, double budget,
                            const std::function<void()>& synchronize = {});

// The host's MemTotal in GiB (0 where /proc/meminfo has none). calibrate.cpp.
double host_memory_gib();

}  // namespace tessera::plan::calibration
