// Replaying a swap plan (swap_plan.h) with its sub-models' costs: when each action would start
// and end on its stream, the step time, and how much of the loading the compute hides. The
// partitioner predicts with it; the executor's measured timeline is drawn beside it.
//
// Semantics: each stream (compute, load, store, host) runs its actions in issue order, one at a
// time; an action starts when its stream is free and what it needs has ended:
//   COMPUTE_F/B i  the LOAD i issued before it and    LOAD     the EVICTs issued before it (the
//                  the ends' LOAD                              memory it fills)
//   STORE_GRAD i   the last COMPUTE i (the ends: the  EVICT i  the last COMPUTE i before it and
//                  last COMPUTE)                               STORE_GRAD i
//   OPTIM i        STORE_GRAD i; with defer_optim every STORE_GRAD of the step
//   (COMPUTE_B i also waits for the STORE_GRADs of i and of the ends issued before it: the
//   gradients it makes must not meet the stored ones)
// LOAD takes parameter_bytes x load_fraction / bandwidth, STORE_GRAD gradient_bytes / bandwidth, COMPUTE and OPTIM
// their sub-model's times; EVICT takes no time and holds no stream (it happens when both are
// true). The pass over the host gradients (plan.gradients_stored_s) holds the host stream before
// the first deferred OPTIM, or, with no OPTIM deferred, ends the step.
#pragma once

#include <vector>

#include "memory/swap/swap_plan.h"

namespace tessera::swap {

struct TimedAction {
  Action action;
  double start = 0, end = 0;
};

struct SwapTimeline {
  std::vector<TimedAction> actions;  // in issue order
  double step_time = 0;              // the last action's end
  double compute_time = 0;           // the compute stream's busy time
  double load_time = 0;              // the load stream's busy time
  // Loads the compute stream waited for: the compute stream's idle time before each COMPUTE.
  double exposed_load = 0;
  // Share of load time hidden behind compute: 1 - exposed_load / load_time (1 without loads).
  double overlap() const { return load_time > 0 ? 1 - exposed_load / load_time : 1; }
};

SwapTimeline simulate_swap_plan(const SwapPlan& plan);

}  // namespace tessera::swap
