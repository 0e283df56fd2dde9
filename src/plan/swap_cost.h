// A swapped layout's step (memory.swap, ATOM; docs/swap.md) predicted without running: the swap
// plan a run would make (plan/swap_cut.h's plan_swap: the partitioner under the device budget, or
// memory.swap_blocks) from the blocks' predicted costs in place of measured ones, replayed by the
// swap engine's own simulator (memory/swap/swap_simulate.h).
//
//   per block   parameters and gradients: 4 bytes per weight element its operations declare
//               (model/operations.h); forward F and backward I + W as plan/cost_model.h prices them,
//               the embedding folded into the first block and the head into the last (as
//               measure_swap_costs folds its measurements); activations: the memory estimate's
//               per micro-batch (plan/memory_estimate.h), split evenly over the blocks
//   the ends    the embedding's and the head's weights, resident for the step
//   the host    each update at host.optimizer_gbs (optim.name's bytes per element as the device's
//               step counts them, plus 6 for the bf16 copy's refresh when LOADs move copies) and the
//               pass over the gradients (the norm and the clipping scale: 12 bytes per element)
//   the link    host.device_link_gbs each way (on a CPU device at most
//               memory.modelled_bandwidth_gbps, the run's throttle)
//   the budget  memory.device_budget_gb
// Under memory.activation_policy = auto the plan is the one chosen with the policy
// (plan/swap_policy.h) from these blocks' costs (cost_model.h's predicted_block_costs).
// Data-parallel replicas of a swapped model (CPU devices only: layout_check.h) average their
// gradients after the last store and before the deferred updates: one all-reduce of the float32
// gradients, which the step waits for (added to the replay's step, not overlapped).
#pragma once

#include <optional>

#include "config/config.h"
#include "core/parallel_dims.h"
#include "memory/swap/swap_plan.h"
#include "plan/cluster.h"
#include "plan/activation_policy.h"
#include "plan/cost_model.h"

namespace tessera::plan {

struct SwapStep {
  swap::SwapPlan plan;
  // memory.activation_policy = auto: the policy chosen with the plan (plan/swap_policy.h), from the
  // blocks' predicted costs; its seconds are inside the plan's backwards.
  std::optional<ActivationPolicy> activation_policy;
  double step_s = 0;     // the replay's step plus the replicas' reduction
  double reduce_s = 0;   // the replicas' all-reduce (0 with one replica)
  double peak_device_bytes = 0;  // the plan's occupancy at its peak and the backward's working set
  double host_bytes = 0;         // the host memory one replica holds (plan/swap_cut.h), less a CPU
                                 // "device"'s budget: its peak_device_bytes are host memory too
};

SwapStep predict_swap_step(const Config& config, const ParallelDims& dims, const Cluster& cluster,
                           const PricedOperations& priced);

}  // namespace tessera::plan
