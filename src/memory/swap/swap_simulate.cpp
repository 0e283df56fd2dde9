// Swap plan replay (swap_simulate.h).
#include "memory/swap/swap_simulate.h"

#include <algorithm>
#include <map>

#include "core/error.h"

namespace tessera::swap {

SwapTimeline simulate_swap_plan(const SwapPlan& plan) {
  require(plan.bandwidth > 0, "internal: a swap plan simulated without a bandwidth");
  SwapTimeline t;
  std::map<Stream, double> free_at;
  const size_t n = plan.subs.size();
  auto slot = [&](int64_t sub) { return sub == kEnds ? n : static_cast<size_t>(sub); };
  std::vector<double> loaded(n + 1, 0), computed(n + 1, 0), stored(n + 1, 0);
  double evicted = 0;       // the latest EVICT issued so far
  double all_stored = 0;    // the latest STORE_GRAD so far (deferred updates wait for it)
  bool gradients_passed = false;  // deferred: the pass over the gradients is on the host stream
  for (const Action& a : plan.actions) {
    const SubModel& s = plan.sub(a.sub);
    const size_t k = slot(a.sub);
    double ready = 0, cost = 0;
    switch (a.op) {
      case Op::Load:
        ready = evicted;
        cost = s.parameter_bytes * plan.load_fraction / plan.bandwidth;
        break;
      case Op::ComputeF:
      case Op::ComputeB:
        ready = std::max(loaded[k], loaded[n]);
        if (a.op == Op::ComputeB) ready = std::max({ready, stored[k], stored[n]});  // gradients it adds to
        cost = a.op == Op::ComputeF ? s.forward_s : s.backward_s;
        break;
      case Op::StoreGrad:
        ready = computed[k];
        cost = s.gradient_bytes / plan.bandwidth;
        break;
      case Op::Optim:
        ready = plan.defer_optim ? all_stored : stored[k];
        cost = s.optim_s;
        if (plan.defer_optim && !gradients_passed) {  // the norm (and scaling) runs first
          double& host = free_at[Stream::host];
          host = std::max(host, all_stored) + plan.gradients_stored_s;
          gradients_passed = true;
        }
        break;
      case Op::Evict:
        ready = std::max(computed[k], stored[k]);
        break;
    }
    double start = ready, end = ready;
    if (a.op != Op::Evict) {
      double& stream = free_at[stream_of(a.op)];
      start = std::max(stream, ready);
      if (a.op == Op::ComputeF || a.op == Op::ComputeB) t.exposed_load += std::max(0.0, ready - stream);
      end = start + cost;
      stream = end;
    }
    switch (a.op) {
      case Op::Load:
        loaded[k] = end;
        t.load_time += cost;
        break;
      case Op::ComputeF:
      case Op::ComputeB:
        computed[k] = end;
        computed[n] = end;  // the ends compute within every sub-model
        t.compute_time += cost;
        break;
      case Op::StoreGrad:
        stored[k] = end;
        all_stored = std::max(all_stored, end);
        break;
      case Op::Evict: evicted = std::max(evicted, end); break;
      case Op::Optim: break;
    }
    t.actions.push_back({a, start, end});
    t.step_time = std::max(t.step_time, end);
  }
  if (!plan.defer_optim) t.step_time += plan.gradients_stored_s;  // the norm, once everything ended
  return t;
}

}  // namespace tessera::swap
