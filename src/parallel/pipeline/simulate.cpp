// Schedule replay (simulate.h).
#include "parallel/pipeline/simulate.h"

#include <algorithm>
#include <map>
#include <tuple>
#include <vector>

namespace tessera::pipeline {
namespace {

// (op, stage, micro) of an event another action waits for; B and I both count as "input
// gradient done", kept under Op::I.
using EventKey = std::tuple<Op, int64_t, int64_t>;

// When each event happened, in a flat table over (event kind, stage, micro-batch): a replay looks
// every action's inputs up, so a table of ranks x thousands of micro-batches stays fast.
class EventTimes {
 public:
  EventTimes(int64_t stages, int64_t micro_batches)
      : stages_(stages), micro_(micro_batches),
        at_(static_cast<size_t>(kKinds * stages * micro_batches), kNotYet) {}
  // -1 when it has not happened (or is outside the table).
  double find(const EventKey& key) const {
    const int64_t i = index(key);
    return i < 0 ? kNotYet : at_[static_cast<size_t>(i)];
  }
  void set(const EventKey& key, double time) {
    const int64_t i = index(key);
    if (i >= 0) at_[static_cast<size_t>(i)] = time;
  }

 private:
  static constexpr int64_t kKinds = 6;
  static constexpr double kNotYet = -1;
  int64_t index(const EventKey& key) const {
    const auto& [op, stage, micro] = key;
    int64_t kind = -1;
    switch (op) {
      case Op::F: kind = 0; break;
      case Op::I: kind = 1; break;
      case Op::SendF: kind = 2; break;
      case Op::SendB: kind = 3; break;
      case Op::RecvF: kind = 4; break;
      case Op::RecvB: kind = 5; break;
      default: return -1;
    }
    if (stage < 0 || stage >= stages_ || micro < 0 || micro >= micro_) return -1;
    return (kind * stages_ + stage) * micro_ + micro;
  }
  int64_t stages_, micro_;
  std::vector<double> at_;
};

}  // namespace

double ActionCosts::of(Op op) const {
  switch (op) {
    case Op::F: return f;
    case Op::B: return b;
    case Op::I: return i;
    case Op::W: return w;
    case Op::Optim: return optim;
    case Op::RecvF:
    case Op::RecvB: return post;
    default: return 0;
  }
}

double ActionCosts::of(const Action& a, int64_t rank) const {
  if (a.op == Op::Optim && rank < static_cast<int64_t>(rank_optim.size())) return rank_optim[rank];
  if (a.is_compute() && !each.empty()) {
    const auto it = each.find({a.op, a.stage, a.micro});
    if (it != each.end()) return it->second;
  }
  if (!a.is_compute() || a.stage >= static_cast<int64_t>(stages.size())) return of(a.op);
  const Compute& c = stages[a.stage];
  switch (a.op) {
    case Op::F: return c.f;
    case Op::B: return c.b;
    case Op::I: return c.i;
    default: return c.w;
  }
}

double Simulation::bubble() const {
  if (step_time <= 0 || busy.empty()) return 0;
  double total = 0;
  for (double b : busy) total += b;
  return 1 - total / (static_cast<double>(busy.size()) * step_time);
}

Simulation simulate_schedule(const Schedule& s, const ActionCosts& costs, Timeline timeline) {
  const int64_t pp = static_cast<int64_t>(s.ranks.size());
  Simulation sim;
  const bool record = timeline == Timeline::record;
  sim.timeline.resize(record ? pp : 0);
  sim.busy.assign(pp, 0);
  sim.peak_held.assign(pp, 0);
  sim.peak_gathered.assign(pp, 0);
  std::vector<double> clock(pp, 0), sent(pp, 0);  // sent: when the rank's last send arrives
  for (int64_t r = 0; r < pp; ++r)
    for (const Action& a : s.ranks[r])
      if (a.op == Op::RecvF || a.op == Op::RecvB) {
        clock[r] = costs.post;  // the first receive, posted ahead
        break;
      }
  std::vector<int64_t> next(pp, 0), held(pp, 0), awaiting_w(pp, 0), made_gradients(pp, 0);
  sim.peak_held_awaiting_w_before_gradients.assign(pp, {});
  sim.peak_held_awaiting_w_with_gradients.assign(pp, {});
  // Per rank: holds per stage, when each stage's fetch completes, whether a compute has waited
  // for it yet, and when the rank's last fetch completes (its fetches run one after another).
  std::vector<std::vector<int64_t>> holds(pp, std::vector<int64_t>(static_cast<size_t>(s.stages()), 0));
  std::vector<std::vector<double>> fetched(pp, std::vector<double>(static_cast<size_t>(s.stages()), 0));
  std::vector<std::vector<char>> awaited(pp, std::vector<char>(static_cast<size_t>(s.stages()), 1));
  std::vector<double> fetching(pp, 0);
  // Compute ends, and arrivals (keyed by the send). Every action's micro-batch is below the
  // table's count (the validator's check; a table that breaks it reads as never done).
  int64_t micro_batches = s.micro_batches;
  for (const auto& row : s.ranks)
    for (const Action& a : row) micro_batches = std::max(micro_batches, a.micro + 1);
  EventTimes done(s.stages(), micro_batches);

  // The time the inputs of `a` on rank r are ready, or -1 when one has not happened yet, with
  // `missing` set to it (the hot path: no text is built here).
  auto ready_time = [&](int64_t r, const Action& a, EventKey& missing) -> double {
    EventKey needs[2];
    int n_needs = 0;
    auto need = [&](Op op, int64_t stage, int64_t micro) { needs[n_needs++] = EventKey{op, stage, micro}; };
    switch (a.op) {
      case Op::F:
        if (a.stage > 0 && s.rank_of(a.stage - 1) == r) need(Op::F, a.stage - 1, a.micro);
        if (a.stage > 0 && s.rank_of(a.stage - 1) != r) need(Op::RecvF, a.stage, a.micro);
        break;
      case Op::B:
      case Op::I:
        need(Op::F, a.stage, a.micro);
        if (a.stage + 1 < s.stages() && s.rank_of(a.stage + 1) == r) need(Op::I, a.stage + 1, a.micro);
        if (a.stage + 1 < s.stages() && s.rank_of(a.stage + 1) != r) need(Op::RecvB, a.stage, a.micro);
        break;
      case Op::W: need(Op::I, a.stage, a.micro); break;
      case Op::SendF: need(Op::F, a.stage, a.micro); break;
      case Op::SendB: need(Op::I, a.stage, a.micro); break;
      case Op::RecvF: need(Op::SendF, a.stage - 1, a.micro); break;
      case Op::RecvB: need(Op::SendB, a.stage + 1, a.micro); break;
      case Op::Gather:
      case Op::Release: break;
      case Op::Optim: return sent[r];
    }
    double ready = 0;
    for (int k = 0; k < n_needs; ++k) {
      const double at = done.find(needs[k]);
      if (at < 0) {
        missing = needs[k];
        return -1;
      }
      ready = std::max(ready, at);
    }
    return ready;
  };
  // What a blocked rank r waits for, in words (for the stuck list only).
  auto waits_for = [&](int64_t r, const EventKey& key) {
    const auto& [op, stage, micro] = key;
    const std::string shown = Action{op == Op::I && !s.split_backward(stage, micro) ? Op::B : op, stage, micro}.str();
    if (op == Op::RecvF || op == Op::RecvB) return "its receive " + shown;
    if (op == Op::SendF || op == Op::SendB) return "the send " + shown + " on rank " + std::to_string(s.rank_of(stage));
    if (s.rank_of(stage) == r) return shown + ", which does not come before it on this rank";
    return shown + " on rank " + std::to_string(s.rank_of(stage));
  };

  for (bool progress = true; progress;) {
    progress = false;
    for (int64_t r = 0; r < pp; ++r) {
      while (next[r] < static_cast<int64_t>(s.ranks[r].size())) {
        const Action& a = s.ranks[r][next[r]];
        EventKey missing;
        const double ready = ready_time(r, a, missing);
        if (ready < 0) break;
        if (a.op == Op::SendF || a.op == Op::SendB) {
          const double start = std::max(clock[r], ready);
          clock[r] = start + costs.send;
          if (record && costs.send > 0) sim.timeline[r].push_back({a, start, clock[r]});
          // A rank's sends are posted in its row's order, so sent[r] is the one before this.
          const double leaves = costs.sends_share_a_link ? std::max(clock[r], sent[r]) : clock[r];
          done.set({a.op, a.stage, a.micro}, leaves + costs.transfer);
          sent[r] = std::max(sent[r], leaves + costs.transfer);
        } else if (a.op == Op::Gather) {
          if (holds[r][a.stage]++ == 0) {
            fetching[r] = fetched[r][a.stage] = std::max(clock[r], fetching[r]) + costs.gather;
            awaited[r][a.stage] = 0;
          }
          int64_t whole = 0;
          for (int64_t h : holds[r]) whole += h > 0 ? 1 : 0;
          sim.peak_gathered[r] = std::max(sim.peak_gathered[r], whole);
        } else if (a.op == Op::Release) {
          holds[r][a.stage] -= 1;
        } else {
          double start = std::max(clock[r], ready);
          if (a.is_compute() && !awaited[r][a.stage]) {  // the exposed part of its stage's fetch
            const double until = std::max(start, fetched[r][a.stage]);
            if (record) sim.timeline[r].push_back({Action{Op::Gather, a.stage, a.micro}, start, until});
            start = until;
            awaited[r][a.stage] = 1;
          }
          const double cost = costs.of(a, r);
          const double end = start + cost;
          clock[r] = end;
          if (a.is_compute()) sim.busy[r] += cost;
          if (record) sim.timeline[r].push_back({a, start, end});
          if (a.is_compute()) {
            const Op key = a.op == Op::B ? Op::I : a.op;
            done.set({key, a.stage, a.micro}, end);
          } else if (a.is_transfer()) {
            done.set({a.op, a.stage, a.micro}, end);
          }
          if (a.op == Op::F) held[r] += 1;
          if (a.op == Op::B || a.op == Op::W) held[r] -= 1, made_gradients[r] = 1;
          if (a.op == Op::I) awaiting_w[r] += 1;
          if (a.op == Op::W) awaiting_w[r] -= 1;
          sim.peak_held[r] = std::max(sim.peak_held[r], held[r]);
          std::vector<int64_t>& by_awaiting = made_gradients[r] ? sim.peak_held_awaiting_w_with_gradients[r]
                                                                : sim.peak_held_awaiting_w_before_gradients[r];
          if (static_cast<int64_t>(by_awaiting.size()) <= awaiting_w[r])
            by_awaiting.resize(static_cast<size_t>(awaiting_w[r] + 1), -1);
          by_awaiting[awaiting_w[r]] = std::max(by_awaiting[awaiting_w[r]], held[r]);
        }
        ++next[r];
        progress = true;
      }
    }
  }
  for (int64_t r = 0; r < pp; ++r) {
    sim.step_time = std::max(sim.step_time, clock[r]);
    if (next[r] < static_cast<int64_t>(s.ranks[r].size())) {
      EventKey missing;
      ready_time(r, s.ranks[r][next[r]], missing);
      sim.stuck.push_back({r, next[r], waits_for(r, missing)});
    }
  }
  return sim;
}

}  // namespace tessera::pipeline
