// The activation policy under swap (memory.swap = true with memory.activation_policy = auto;
// docs/memory.md). The device budget holds the swap plan's resident sub-models, their gradients
// and the blocks' activations together (swap_cut.h's plan_swap counts all three), so the policy is
// chosen with the plan rather than from a share left by a fixed model state:
//   candidates  the activation policies (activation_policy.h, per micro-batch) for allowances
//               from every block's largest option down to 1/4096 of it, halving by sqrt(2)
//               (one policy per distinct choice);
//   each        priced by the swap plan it leaves: each block's activation bytes the option's,
//               its backward longer by the option's added seconds (recomputation, the copies the
//               neighbours do not hide, coding), the policy's reserves kept out of the budget (two
//               of the largest offloaded group for the groups in flight, the largest fully
//               recomputed block's whole activations for its backward); planned under
//               memory.device_budget_gb and replayed (memory/swap/swap_simulate.h);
//   the choice  the least replayed step among the plans that fit; refused naming
//               memory.device_budget_gb when none does.
// The swap engine then trains with the chosen policy's blocks (parallel/parallelize.cpp sets each
// block's checkpointing, offload and codec as without swap).
#pragma once

#include "config/config.h"
#include "core/parallel_dims.h"
#include "memory/swap/swap_plan.h"
#include "plan/activation_policy.h"
#include "plan/stage_cut.h"
#include "plan/swap_cut.h"

namespace tessera {

struct SwappedActivationPolicy {
  ActivationPolicy policy;
  swap::SwapPlan plan;
  double step_s = 0;  // the plan's replayed step
  int64_t candidates = 0;  // distinct policies priced
};

SwappedActivationPolicy choose_swapped_activation_policy(const Config& config, const ParallelDims& dims,
                                                         const BlockCosts& measured, const SwapCosts& costs,
                                                         bool cpu_device);

}  // namespace tessera
