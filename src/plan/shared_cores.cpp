// Pipelines on shared CPU cores (shared_cores.h).
#include "plan/shared_cores.h"

#include <algorithm>
#include <cmath>
#include <tuple>
#include <utility>
#include <vector>

namespace tessera::plan {
namespace {

constexpr int kReplays = 12;
constexpr double kSettled = 0.005;

struct Interval {
  double start = 0, end = 0;
  std::tuple<pipeline::Op, int64_t, int64_t> key;
  double cost = 0;  // at slowdown(world)
};

// Per interval, the mean number of intervals running during it (itself included): the count of
// running intervals is piecewise constant between their ends, integrated by prefix sums.
std::vector<double> mean_running(const std::vector<Interval>& intervals) {
  std::vector<std::pair<double, int>> edges;
  edges.reserve(2 * intervals.size());
  for (const Interval& a : intervals) edges.emplace_back(a.start, +1), edges.emplace_back(a.end, -1);
  std::sort(edges.begin(), edges.end());
  // at[i]: a breakpoint; integral[i]: the count's integral from the first breakpoint to at[i].
  std::vector<double> at, integral;
  int running = 0;
  double area = 0, last = edges.empty() ? 0 : edges.front().first;
  for (const auto& [t, change] : edges) {
    area += running * (t - last);
    last = t;
    running += change;
    if (!at.empty() && at.back() == t) {
      integral.back() = area;
    } else {
      at.push_back(t), integral.push_back(area);
    }
  }
  auto integral_to = [&](double t) {
    const size_t i = static_cast<size_t>(std::lower_bound(at.begin(), at.end(), t) - at.begin());
    return integral[std::min(i, at.size() - 1)];
  };
  std::vector<double> out;
  out.reserve(intervals.size());
  for (const Interval& a : intervals) {
    const double length = a.end - a.start;
    out.push_back(length > 0 ? std::max(1.0, (integral_to(a.end) - integral_to(a.start)) / length) : 1.0);
  }
  return out;
}

}  // namespace

bool shares_cores(const Cluster& cluster, int64_t world) {
  return cluster.device.kind == "cpu" && cluster.cluster.slowdown(world) > 1;
}

pipeline::Simulation simulate_on_shared_cores(const pipeline::Schedule& schedule, const pipeline::ActionCosts& costs,
                                              const Cluster& cluster, int64_t world) {
  const double full = cluster.cluster.slowdown(world);
  // The pipeline's other replicas (data, tensor, sequence and expert parallel ranks) run the same
  // table at the same time on the node's other cores: k of this pipeline's ranks computing means
  // k x world / pp of the node's.
  const double replicas = static_cast<double>(world) / static_cast<double>(schedule.ranks.size());
  pipeline::ActionCosts replayed = costs;
  pipeline::Simulation sim = pipeline::simulate_schedule(schedule, replayed, pipeline::Timeline::record);
  for (int replay = 0; replay < kReplays; ++replay) {
    std::vector<Interval> intervals;
    for (size_t r = 0; r < sim.timeline.size(); ++r)
      for (const pipeline::TimedAction& t : sim.timeline[r])
        if (t.action.is_compute())
          intervals.push_back({t.start, t.end, {t.action.op, t.action.stage, t.action.micro},
                               costs.of(t.action, static_cast<int64_t>(r))});
    const std::vector<double> running = mean_running(intervals);
    double moved = 0;
    for (size_t i = 0; i < intervals.size(); ++i) {
      const Interval& a = intervals[i];
      const double target = a.cost * std::min(full, cluster.cluster.slowdown_at(running[i] * replicas)) / full;
      const double before = a.end - a.start;
      const double after = 0.5 * (before + target);
      if (before > 0) moved = std::max(moved, std::abs(after - before) / before);
      replayed.each[a.key] = after;
    }
    sim = pipeline::simulate_schedule(schedule, replayed, pipeline::Timeline::record);
    if (moved < kSettled) break;
  }
  return sim;
}

}  // namespace tessera::plan
