// Swap plan partitioning by dynamic programming over contiguous cuts (swap_partition.h).
#include "memory/swap/swap_partition.h"

#include <cstdio>
#include <algorithm>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include "core/error.h"
#include "memory/swap/swap_simulate.h"

namespace tessera::swap {
namespace {

SubModel merge(const std::vector<SubModel>& blocks, int64_t first, int64_t end) {
  SubModel s;
  s.first = blocks[static_cast<size_t>(first)].first;
  s.end = blocks[static_cast<size_t>(end - 1)].end;
  for (int64_t b = first; b < end; ++b) {
    const SubModel& x = blocks[static_cast<size_t>(b)];
    s.parameter_bytes += x.parameter_bytes;
    s.gradient_bytes += x.gradient_bytes;
    s.activation_bytes += x.activation_bytes;
    s.forward_s += x.forward_s;
    s.backward_s += x.backward_s;
    s.optim_s += x.optim_s;
  }
  return s;
}

// The plan of `boundaries`, or none when it does not validate.
std::optional<SwapPlan> valid_cut(const std::vector<SubModel>& blocks, const SwapPlan& shape,
                                  const std::vector<int64_t>& boundaries) {
  try {
    return cut_swap_plan(blocks, shape, boundaries);
  } catch (const Error&) {
    return std::nullopt;
  }
}

// The plan of `boundaries` and its replayed step time; infinity when it does not validate.
std::pair<SwapPlan, double> try_cut(const std::vector<SubModel>& blocks, const SwapPlan& shape,
                                    const std::vector<int64_t>& boundaries) {
  std::optional<SwapPlan> plan = valid_cut(blocks, shape, boundaries);
  if (!plan) return {SwapPlan{}, std::numeric_limits<double>::infinity()};
  const double time = simulate_swap_plan(*plan).step_time;
  return {std::move(*plan), time};
}


// The cuts one move from `boundaries`: one boundary moved by a block, one dropped, or one added.
std::vector<std::vector<int64_t>> neighbours(const std::vector<int64_t>& boundaries, int64_t n) {
  std::vector<std::vector<int64_t>> out;
  for (size_t b = 1; b + 1 < boundaries.size(); ++b) {
    for (int64_t d : {-1, 1}) {
      std::vector<int64_t> c = boundaries;
      c[b] += d;
      if (c[b] > c[b - 1] && c[b] < c[b + 1]) out.push_back(c);
    }
    std::vector<int64_t> c = boundaries;
    c.erase(c.begin() + static_cast<std::ptrdiff_t>(b));
    out.push_back(c);
  }
  for (int64_t l = 1; l < n; ++l)
    if (!std::binary_search(boundaries.begin(), boundaries.end(), l)) {
      std::vector<int64_t> c = boundaries;
      c.insert(std::upper_bound(c.begin(), c.end(), l), l);
      out.push_back(c);
    }
  return out;
}

// Local search from the dynamic programme's cut with the exact check and the replay: one move at a
// time (neighbours) while the step gets faster. Then, from the fastest cut, moves that lower the
// device peak while the step stays within kPeakTolerance of the fastest: cuts that near-tie on time
// (a sub-model of two blocks or two of one, when loads hide either way) are ordered by the memory
// they hold, not by which one the measured times' noise makes faster, so a run and `tessera plan`
// (which prices the blocks instead of measuring them) choose the same cut.
SwapPlan improve(const std::vector<SubModel>& blocks, const SwapPlan& shape, std::vector<int64_t> boundaries) {
  auto [plan, time] = try_cut(blocks, shape, boundaries);
  const auto n = static_cast<int64_t>(blocks.size());
  for (bool better = true; better;) {
    better = false;
    for (const auto& c : neighbours(boundaries, n)) {
      auto [p, t] = try_cut(blocks, shape, c);
      if (t < time * (1 - 1e-9)) {
        plan = std::move(p);
        time = t;
        boundaries = c;
        better = true;
      }
    }
  }
  require(time < std::numeric_limits<double>::infinity(), "internal: the partitioner's cut does not validate");
  const double slowest = time * (1 + kPeakTolerance);
  double peak = occupancy(plan).peak;
  for (bool smaller = true; smaller;) {
    smaller = false;
    for (const auto& c : neighbours(boundaries, n)) {
      // The peak first: only a cut that holds less is replayed.
      std::optional<SwapPlan> p = valid_cut(blocks, shape, c);
      if (!p) continue;
      const double q = occupancy(*p).peak;
      if (q < peak * (1 - 1e-9) && simulate_swap_plan(*p).step_time <= slowest) {
        plan = std::move(*p);
        peak = q;
        boundaries = c;
        smaller = true;
      }
    }
  }
  return plan;
}

// The budget as the user gave it (memory.device_budget_gb) and, where some is reserved, what the
// sub-models are left.
std::string budget_text(const SwapPlan& shape) {
  char text[160];
  const double gib = 1024.0 * 1024.0 * 1024.0;
  if (shape.reserved_bytes > 0)
    std::snprintf(text, sizeof text, "memory.device_budget_gb = %g GiB less %s reserved (%s left)",
                  (shape.device_budget_bytes + shape.reserved_bytes) / gib, format_mib(shape.reserved_bytes).c_str(),
                  format_mib(shape.device_budget_bytes).c_str());
  else
    std::snprintf(text, sizeof text, "memory.device_budget_gb = %g GiB", shape.device_budget_bytes / gib);
  return text;
}

}  // namespace

SwapPlan cut_swap_plan(const std::vector<SubModel>& blocks, const SwapPlan& shape, const std::vector<int64_t>& boundaries) {
  require(boundaries.size() >= 2 && boundaries.front() == 0 &&
              boundaries.back() == static_cast<int64_t>(blocks.size()),
          "internal: a swap cut must run from block 0 to block ", blocks.size());
  SwapPlan plan = shape;
  plan.subs.clear();
  for (size_t i = 0; i + 1 < boundaries.size(); ++i) plan.subs.push_back(merge(blocks, boundaries[i], boundaries[i + 1]));
  plan = build_swap_plan(std::move(plan));
  validate_swap_plan(plan);
  return plan;
}

SwapPlan partition_swap_plan(const std::vector<SubModel>& blocks, const SwapPlan& shape) {
  const auto n = static_cast<int64_t>(blocks.size());
  require(n > 0, "internal: partitioning a model of no blocks");
  const double budget = shape.device_budget_bytes, bw = shape.bandwidth / shape.load_fraction;  // device bytes/s
  const double ends = shape.ends.parameter_bytes + shape.ends.gradient_bytes;
  std::vector<double> act(static_cast<size_t>(n) + 1, 0);  // activations of blocks [0, l)
  for (int64_t l = 0; l < n; ++l) act[l + 1] = act[l] + blocks[static_cast<size_t>(l)].activation_bytes;
  // A block must fit with its gradients, the ends and the activations held when it computes.
  for (int64_t l = 0; l < n; ++l) {
    const SubModel& b = blocks[static_cast<size_t>(l)];
    const double need = ends + act[l + 1] + b.parameter_bytes + b.gradient_bytes;
    if (need > budget)
      fail(budget_text(shape), " is too small for block ", l, ": it needs ", format_mib(need), " on the device (its parameters ",
           format_mib(b.parameter_bytes), " and gradients ", format_mib(b.gradient_bytes), ", the activations of blocks 0-", l, " ",
           format_mib(act[l + 1]), ", the ends ", format_mib(ends), "); raise the budget, use activation checkpointing "
           "(memory.activation_checkpointing) or smaller micro-batches (train.batch_size)");
  }
  // Sub-model [i, j) as a merged SubModel, cached.
  std::vector<std::vector<SubModel>> sub(static_cast<size_t>(n), std::vector<SubModel>(static_cast<size_t>(n) + 1));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = i + 1; j <= n; ++j) sub[i][j] = merge(blocks, i, j);
  const double inf = std::numeric_limits<double>::infinity();
  // best[i][j]: the least pairwise cost of cutting blocks [0, j) with [i, j) the last sub-model
  // (every pair feasible); from[i][j]: the start of the sub-model before it (-1: none).
  std::vector<std::vector<double>> best(static_cast<size_t>(n), std::vector<double>(static_cast<size_t>(n) + 1, inf));
  std::vector<std::vector<int64_t>> from(static_cast<size_t>(n), std::vector<int64_t>(static_cast<size_t>(n) + 1, -1));
  for (int64_t j = 1; j <= n; ++j) best[0][j] = sub[0][j].parameter_bytes / bw;  // the first load is exposed
  for (int64_t i = 1; i < n; ++i)
    for (int64_t j = i + 1; j <= n; ++j)
      for (int64_t h = 0; h < i; ++h) {
        if (best[h][i] == inf) continue;
        const SubModel &a = sub[h][i], &b = sub[i][j];
        const double held = ends + act[i] + a.parameter_bytes + b.parameter_bytes +
                            std::max(a.gradient_bytes, b.gradient_bytes);
        if (held > budget) continue;
        const double cost = best[h][i] + std::max(a.forward_s, b.parameter_bytes / bw) +
                            std::max(b.backward_s, a.parameter_bytes / bw);
        if (cost < best[i][j]) {
          best[i][j] = cost;
          from[i][j] = h;
        }
      }
  // The last sub-model [i, n) at the turn.
  int64_t last = -1;
  double least = inf;
  for (int64_t i = 0; i < n; ++i) {
    const SubModel& s = sub[i][n];
    if (best[i][n] == inf || ends + act[n] + s.parameter_bytes + s.gradient_bytes > budget) continue;
    const double cost = best[i][n] + s.forward_s + s.backward_s;
    if (cost < least) {
      least = cost;
      last = i;
    }
  }
  if (last < 0) {
    // The pairs are conservative; the finest cut may still pass the exact check.
    std::vector<int64_t> finest;
    for (int64_t l = 0; l <= n; ++l) finest.push_back(l);
    if (try_cut(blocks, shape, finest).second < inf) return improve(blocks, shape, finest);
  }
  if (last < 0)
    fail(budget_text(shape), ": no cut of the ", n,
         " blocks into sub-models fits (every block fits alone, but no two neighbours fit together with the ",
         "activations held when they meet: ", format_mib(act[n]), " at the turn, the ends ", format_mib(ends),
         "); raise the budget or use activation checkpointing");
  std::vector<int64_t> boundaries{n};
  for (int64_t i = last, j = n; i >= 0;) {
    boundaries.insert(boundaries.begin(), i);
    const int64_t h = from[i][j];
    j = i;
    i = h;
  }
  return improve(blocks, shape, boundaries);
}

}  // namespace tessera::swap
