// The built-in schedules (schedule_builders.h).
#include "parallel/pipeline/schedule_builders.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <set>

#include "core/error.h"
#include "parallel/pipeline/validate.h"

namespace tessera::pipeline {
namespace {

Schedule empty_schedule(const std::string& name, int64_t pp, int64_t m, int64_t v, Placement placement) {
  Schedule s;
  s.name = name;
  s.pp = pp;
  s.v = v;
  s.micro_batches = m;
  s.placement = placement;
  s.ranks.resize(pp);
  s.peak_limit.resize(pp);
  return s;
}

Schedule gpipe(int64_t p, int64_t m) {
  Schedule s = empty_schedule("gpipe", p, m, 1, Placement::loop);
  for (int64_t r = 0; r < p; ++r) {
    for (int64_t k = 0; k < m; ++k) s.ranks[r].push_back({Op::F, r, k});
    for (int64_t k = 0; k < m; ++k) s.ranks[r].push_back({Op::B, r, k});
    s.peak_limit[r] = m;
  }
  return s;
}

Schedule one_f_one_b(int64_t p, int64_t m) {
  Schedule s = empty_schedule("1f1b", p, m, 1, Placement::loop);
  for (int64_t r = 0; r < p; ++r) {
    const int64_t warmup = std::min(p - r - 1, m);
    auto& a = s.ranks[r];
    for (int64_t k = 0; k < warmup; ++k) a.push_back({Op::F, r, k});
    for (int64_t i = 0; i < m - warmup; ++i) {
      a.push_back({Op::F, r, warmup + i});
      a.push_back({Op::B, r, i});
    }
    for (int64_t k = m - warmup; k < m; ++k) a.push_back({Op::B, r, k});
    s.peak_limit[r] = std::min(p - r, m);
  }
  return s;
}

// Megatron-LM's interleaved 1F1B: rank r walks its m*v (chunk, micro-batch) pairs in groups of p
// micro-batches per chunk, forwards in chunk order 0..v-1 and backwards in v-1..0.
Schedule interleaved(int64_t p, int64_t m, int64_t v) {
  Schedule s = empty_schedule("interleaved", p, m, v, Placement::loop);
  const int64_t total = m * v, group = p * v;
  auto micro = [&](int64_t k) { return (k / group) * p + k % p; };
  for (int64_t r = 0; r < p; ++r) {
    const int64_t warmup = std::min((p - r - 1) * 2 + (v - 1) * p, total);
    auto forward = [&](int64_t k) { return Action{Op::F, ((k % group) / p) * p + r, micro(k)}; };
    auto backward = [&](int64_t k) { return Action{Op::B, (v - 1 - (k % group) / p) * p + r, micro(k)}; };
    auto& a = s.ranks[r];
    for (int64_t k = 0; k < warmup; ++k) a.push_back(forward(k));
    for (int64_t i = 0; i < total - warmup; ++i) {
      a.push_back(forward(warmup + i));
      a.push_back(backward(i));
    }
    for (int64_t k = total - warmup; k < total; ++k) a.push_back(backward(k));
    s.peak_limit[r] = std::min(warmup + 1, total);
  }
  return s;
}

// Rank r delays each W by r micro-batches, so that the input gradients of the last micro-batches
// run back to rank 0 without waiting behind W's; every rank then holds at most p activations.
Schedule zero_bubble_h1(int64_t p, int64_t m) {
  Schedule s = empty_schedule("zbh1", p, m, 1, Placement::loop);
  for (int64_t r = 0; r < p; ++r) {
    auto& a = s.ranks[r];
    int64_t next_f = std::min(p - r, m), next_w = 0;
    for (int64_t k = 0; k < next_f; ++k) a.push_back({Op::F, r, k});
    for (int64_t j = 0; j < m; ++j) {
      a.push_back({Op::I, r, j});
      if (j - r >= 0) a.push_back({Op::W, r, next_w++});
      if (next_f < m) a.push_back({Op::F, r, next_f++});
    }
    while (next_w < m) a.push_back({Op::W, r, next_w++});
    s.peak_limit[r] = std::min(p, m);
  }
  return s;
}

// Whether some stage's whole backward B costs less than its I + W under `costs` (`stages` stages;
// a stage without costs of its own has the defaults, ActionCosts::of).
bool whole_backward_cheaper(const ActionCosts& costs, int64_t stages) {
  for (int64_t s = 0; s < stages; ++s)
    if (costs.of(Action{Op::B, s, 0}, 0) < costs.of(Action{Op::I, s, 0}, 0) + costs.of(Action{Op::W, s, 0}, 0))
      return true;
  return false;
}

// A table's step under `costs`, with its communication added.
double simulated_step(Schedule s, const ActionCosts& costs) {
  add_communication(s);
  return simulate_schedule(s, costs, Timeline::skip).step_time;
}

// Each I of `s` in turn made whole (B at its place, its W dropped) where the simulated step is no
// longer: one pass, each rank's first kTries / p I's (a simulation each, which grows with p x m).
Schedule whole_where_no_longer(Schedule best, const ActionCosts& costs) {
  constexpr int64_t kTries = 2048;
  double best_step = simulated_step(best, costs);
  for (int64_t r = 0; r < best.pp; ++r) {
    int64_t tries = 0;
    for (size_t k = 0; k < best.ranks[r].size() && tries < kTries / best.pp; ++k) {
      const Action a = best.ranks[r][k];
      if (a.op != Op::I) continue;
      ++tries;
      Schedule s = best;
      auto& row = s.ranks[r];
      row[k].op = Op::B;
      row.erase(std::find(row.begin() + k, row.end(), Action{Op::W, a.stage, a.micro}));
      const double step = simulated_step(s, costs);
      if (step <= best_step) best = std::move(s), best_step = step;
    }
  }
  return best;
}

// ZB-V by list scheduling (the zero-bubble paper's greedy), in time with each action's cost (unit
// costs: the slots of the paper): whenever a rank is free it takes the first available of: an I
// whose inputs are ready (lowest micro-batch, deeper stage first), an F while it holds fewer than
// `limit` activations (lowest micro-batch, deeper stage first), its oldest pending W; with nothing
// available it waits for the next action to finish anywhere. With `reserve` a rank keeps its last
// slot for a chunk-1 forward: costs that let a rank's first-chunk forwards run far ahead can fill
// every rank with activations whose backward waits for a chunk-1 forward no rank has room for;
// keeping the slot lets the oldest micro-batch always finish. A rank that already defers `kept`
// W's runs its next backward whole (B, which frees its activation at once) instead of as an I: the
// W's are there to fill the rank's idle time, and where a whole backward costs less than its two
// halves, deferring more of them only adds the split's cost. Returns nullopt on a deadlock.
std::optional<Schedule> zero_bubble_v_list(int64_t p, int64_t m, const ActionCosts& costs, bool reserve,
                                           size_t kept) {
  Schedule s = empty_schedule("zbv", p, m, 2, Placement::vee);
  const int64_t stages = 2 * p, limit = 2 * p;
  constexpr int64_t kNever = std::numeric_limits<int64_t>::max();
  // (stage, micro) -> finish time, flat; infinity until scheduled.
  constexpr double kUnscheduled = std::numeric_limits<double>::infinity();
  std::vector<double> f_done(static_cast<size_t>(stages * m), kUnscheduled), i_done(f_done);
  auto at = [&](int64_t stage, int64_t mb) { return static_cast<size_t>(stage * m + mb); };
  auto done_by = [&](const std::vector<double>& done, int64_t stage, int64_t mb, double t) {
    return done[at(stage, mb)] <= t;
  };
  std::vector<std::vector<int64_t>> next_f(p, std::vector<int64_t>(2, 0));
  std::vector<int64_t> open_i(static_cast<size_t>(stages), 0);  // per stage: the lowest micro-batch without its I
  std::vector<int64_t> held(p, 0);
  std::vector<double> free_at(p, 0);
  std::vector<int64_t> remaining(p, 6 * m);  // per rank: F, I and W of its two stages
  std::set<double> finishes;  // every scheduled action's finish time
  std::vector<std::vector<std::pair<int64_t, int64_t>>> pending_w(p);
  int64_t scheduled = 0, rounds = 0;
  const int64_t work = 3 * stages * m;
  while (scheduled < work) {
    require(++rounds < 100 * work + 100 * p, "internal: the ZB-V list scheduler made no progress");
    // Every rank free at the earliest time T decides, in rank order, on what finished by T.
    double t = std::numeric_limits<double>::infinity();
    for (int64_t r = 0; r < p; ++r)
      if (remaining[r] > 0) t = std::min(t, free_at[r]);
    std::vector<int64_t> idle;
    for (int64_t r = 0; r < p; ++r) {
      if (remaining[r] == 0 || free_at[r] != t) continue;
      const int64_t mine[2] = {r, stages - 1 - r};  // chunk 0 and chunk 1 of rank r
      Action chosen{Op::W, -1, kNever};
      // Only micro-batches between the lowest whose I is open and the last forward issued can
      // have an I ready: the same first choice as scanning them all.
      const int64_t lowest = std::min(open_i[mine[0]], open_i[mine[1]]);
      const int64_t issued = std::max(next_f[r][0], next_f[r][1]);
      for (int64_t mb = lowest; mb < issued && chosen.stage < 0; ++mb)
        for (int64_t stage : {mine[1], mine[0]}) {
          if (!done_by(f_done, stage, mb, t) || i_done[at(stage, mb)] != kUnscheduled) continue;
          if (stage + 1 < stages && !done_by(i_done, stage + 1, mb, t)) continue;
          chosen = {pending_w[r].size() < kept ? Op::I : Op::B, stage, mb};
          break;
        }
      if (chosen.stage < 0 && held[r] < limit) {
        for (int64_t c : {1, 0}) {
          const int64_t stage = mine[c], mb = next_f[r][c];
          if (mb >= m || (stage > 0 && !done_by(f_done, stage - 1, mb, t))) continue;
          if (reserve && c == 0 && held[r] + 1 >= limit) continue;  // the last slot is chunk 1's
          if (chosen.stage < 0 || mb < chosen.micro) chosen = {Op::F, stage, mb};
        }
      }
      if (chosen.stage < 0 && !pending_w[r].empty()) {
        chosen = {Op::W, pending_w[r].front().first, pending_w[r].front().second};
        pending_w[r].erase(pending_w[r].begin());
      }
      if (chosen.stage < 0) {
        idle.push_back(r);
        continue;
      }
      s.ranks[r].push_back(chosen);
      const int64_t parts = chosen.op == Op::B ? 2 : 1;  // a whole backward is an I and its W
      scheduled += parts;
      remaining[r] -= parts;
      const double end = t + costs.of(chosen, r);
      free_at[r] = end;
      finishes.insert(end);
      if (chosen.op == Op::F) {
        f_done[at(chosen.stage, chosen.micro)] = end;
        ++next_f[r][chosen.stage == mine[0] ? 0 : 1];
        ++held[r];
      } else {
        if (chosen.op != Op::W) {  // I or B: the input gradient
          i_done[at(chosen.stage, chosen.micro)] = end;
          int64_t& open = open_i[chosen.stage];
          while (open < m && i_done[at(chosen.stage, open)] != kUnscheduled) ++open;
        }
        if (chosen.op == Op::I) pending_w[r].push_back({chosen.stage, chosen.micro});
        else --held[r];  // B or W frees the activation
      }
    }
    // A rank with nothing available waits for the next action to finish anywhere.
    const auto later = finishes.upper_bound(t);
    const double next = later == finishes.end() ? std::numeric_limits<double>::infinity() : *later;
    if (!idle.empty() && !std::isfinite(next)) return std::nullopt;  // every rank waits: deadlock
    for (int64_t r : idle) free_at[r] = next;
  }
  for (int64_t r = 0; r < p; ++r) s.peak_limit[r] = limit;
  return s;
}

// The greedy as the paper has it (every backward split, every W deferred), or, where the costs
// make it deadlock, with the reserved slot; then, where a whole backward costs less than its I and
// W, the same greedy keeping at most `kept` W's per rank for kept = 0 .. 2p, and the table the
// simulator with `costs` gives the shortest step (the paper's on a tie, so unit costs keep it).
Schedule zero_bubble_v(int64_t p, int64_t m, const ActionCosts& costs) {
  constexpr size_t kEvery = std::numeric_limits<size_t>::max();
  auto build = [&](size_t kept) {
    std::optional<Schedule> s = zero_bubble_v_list(p, m, costs, false, kept);
    return s ? s : zero_bubble_v_list(p, m, costs, true, kept);
  };
  std::optional<Schedule> best = build(kEvery);
  require(best.has_value(), "internal: the ZB-V list scheduler deadlocked with a slot kept for chunk 1");
  if (!whole_backward_cheaper(costs, 2 * p)) return *best;
  double best_step = simulated_step(*best, costs);
  for (size_t kept = 0; kept <= static_cast<size_t>(2 * p); ++kept) {
    std::optional<Schedule> s = build(kept);
    if (!s) continue;
    const double step = simulated_step(*s, costs);
    if (step < best_step) best = std::move(s), best_step = step;
  }
  best = whole_where_no_longer(std::move(*best), costs);
  return *best;
}

// DualPipeV (DeepSeek's DualPipe cut in half, V placement): rank r's chunk 0 is stage r, chunk 1
// stage 2p-1-r. Its row, in phases (counts per rank; "F0 B1" a forward of one chunk paired with
// a backward of the other, which DualPipe overlaps; a zero-bubble backward is I now and W later,
// the W's run in the order of their I's):
//   1  2(p-r-1) x F0          2  r+1 x F0 F1          3  p-r-1 x I1 W F1
//   4  m-2p+r+1 x F0 B1 F1 B0 (the steady state)      5  p-r-1 x B1 F1 B0
//   6  r+1 x B1 B0, the later half of them zero-bubble (I), from the middle on
//   7  p-r-1 x W I0           8  r+1 x W
Schedule dualpipe_v(int64_t p, int64_t m) {
  require(m >= 2 * p, "parallel.pp_schedule = dualpipev needs at least 2 x parallel.pp = ", 2 * p,
          " micro-batches per step (the accumulation count; got ", m, ")");
  Schedule s = empty_schedule("dualpipev", p, m, 2, Placement::vee);
  for (int64_t r = 0; r < p; ++r) {
    std::vector<Action>& row = s.ranks[r];
    const int64_t stage[2] = {r, 2 * p - 1 - r};
    int64_t next_f[2] = {0, 0}, next_b[2] = {0, 0};
    std::vector<Action> weights;  // W's waiting, oldest first
    auto forward = [&](int c) { row.push_back({Op::F, stage[c], next_f[c]++}); };
    auto backward = [&](int c, bool zero_bubble) {
      const int64_t j = next_b[c]++;
      row.push_back({zero_bubble ? Op::I : Op::B, stage[c], j});
      if (zero_bubble) weights.push_back({Op::W, stage[c], j});
    };
    auto weight = [&] {
      row.push_back(weights.front());
      weights.erase(weights.begin());
    };
    for (int64_t i = 0; i < 2 * (p - r - 1); ++i) forward(0);
    for (int64_t i = 0; i < r + 1; ++i) { forward(0); forward(1); }
    for (int64_t i = 0; i < p - r - 1; ++i) { backward(1, true); weight(); forward(1); }
    for (int64_t i = 0; i < m - 2 * p + r + 1; ++i) { forward(0); backward(1, false); forward(1); backward(0, false); }
    for (int64_t i = 0; i < p - r - 1; ++i) { backward(1, false); forward(1); backward(0, false); }
    bool zero_bubble = false;
    for (int64_t i = 0; i < r + 1; ++i) {
      if (i == (r + 1) / 2 && r % 2 == 1) zero_bubble = true;
      backward(1, zero_bubble);
      if (i == (r + 1) / 2 && r % 2 == 0) zero_bubble = true;
      backward(0, zero_bubble);
    }
    for (int64_t i = 0; i < p - r - 1; ++i) { weight(); backward(0, true); }
    for (int64_t i = 0; i < r + 1; ++i) weight();
    require(weights.empty(), "internal: DualPipeV left weight gradients of rank ", r, " unscheduled");
    s.peak_limit[r] = 2 * p + 1;
  }
  return s;
}

}  // namespace

const std::vector<std::string>& schedule_names() {
  static const std::vector<std::string> names = {"gpipe", "1f1b", "interleaved", "zbh1", "zbv", "dualpipev"};
  return names;
}

Placement placement_of(const std::string& name) {
  return name == "zbv" || name == "dualpipev" ? Placement::vee : Placement::loop;
}

Schedule forward_only_schedule(const Schedule& like, int64_t micro_batches) {
  Schedule s;
  s.name = like.name + " (forward only)";
  s.pp = like.pp;
  s.v = like.v;
  s.micro_batches = micro_batches;
  s.placement = like.placement;
  s.ranks.assign(static_cast<size_t>(s.pp), {});
  for (int64_t m = 0; m < micro_batches; ++m)
    for (int64_t stage = 0; stage < s.stages(); ++stage) s.ranks[static_cast<size_t>(s.rank_of(stage))].push_back({Op::F, stage, m});
  add_communication(s);
  return s;
}

Schedule census_schedule(const Schedule& like) {
  Schedule s = forward_only_schedule(like, 1);
  s.name = like.name + " (census)";
  for (int64_t stage = s.stages() - 1; stage >= 0; --stage) s.ranks[static_cast<size_t>(s.rank_of(stage))].push_back({Op::B, stage, 0});
  add_communication(s);
  return s;
}

Schedule build_schedule(const std::string& name, int64_t pp, int64_t micro_batches, int64_t v,
                        const ActionCosts& costs) {
  require(pp >= 1, "parallel.pp must be at least 1 (got ", pp, ")");
  require(micro_batches >= 1, "a pipeline step needs at least one micro-batch (got ", micro_batches, ")");
  const int64_t m = micro_batches;
  if (name == "interleaved") {
    require(v >= 2, "parallel.pp_schedule = interleaved needs parallel.pp_virtual >= 2 stages per rank (got ", v, ")");
    require(m % pp == 0, "parallel.pp_schedule = interleaved needs the micro-batches of a step (the accumulation count, "
            "train.global_batch_size / (train.batch_size x dp)) to be a multiple of parallel.pp = ", pp, " (got ", m, ")");
  } else if (name == "zbv" || name == "dualpipev") {
    require(v == 2, "parallel.pp_schedule = ", name, " places exactly 2 stages per rank (parallel.pp_virtual = 2, got ",
            v, ")");
  } else {
    require(v == 1, "parallel.pp_schedule = ", name, " places one stage per rank: parallel.pp_virtual must be 1 (got ",
            v, "); interleaved, zbv and dualpipev take several");
  }
  Schedule s;
  if (name == "gpipe") s = gpipe(pp, m);
  else if (name == "1f1b") s = one_f_one_b(pp, m);
  else if (name == "interleaved") s = interleaved(pp, m, v);
  else if (name == "zbh1") {
    s = zero_bubble_h1(pp, m);
    if (whole_backward_cheaper(costs, pp)) s = whole_where_no_longer(std::move(s), costs);
  }
  else if (name == "zbv") s = zero_bubble_v(pp, m, costs);
  else if (name == "dualpipev") s = dualpipe_v(pp, m);
  else {
    std::string known;
    for (const auto& n : schedule_names()) known += (known.empty() ? "" : ", ") + n;
    fail("parallel.pp_schedule = '", name, "' is not a schedule (", known, ", or file:PATH)");
  }
  add_communication(s);
  return s;
}

Schedule schedule_for_options(const ParallelOptions& parallel, int64_t pp, int64_t micro_batches, Gathers gathers,
                              const ActionCosts& costs) {
  const int64_t v = parallel.pipeline_virtual();
  Schedule s = parallel.pp_schedule.rfind("file:", 0) == 0
                   ? read_schedule_csv(parallel.pp_schedule.substr(5), pp, v, micro_batches, Placement::loop)
                   : build_schedule(parallel.pp_schedule, pp, micro_batches, v, costs);
  add_parameter_actions(s, gathers);
  validate_schedule(s);
  return s;
}

}  // namespace tessera::pipeline
