// Each rank's room for its blocks' activations under memory.device_budget_gb, and the check of the
// budget before a run (activation_policy.h).
#include <string>

#include "core/byte_size.h"
#include "core/error.h"
#include "plan/activation_policy.h"
#include "plan/layout.h"
#include "plan/memory_estimate.h"

namespace tessera {
namespace {

std::string rank_name(const ActivationShare& share) {
  return share.pipeline_rank < 0 ? std::string() : " on pipeline rank " + std::to_string(share.pipeline_rank);
}

}  // namespace

std::vector<ActivationShare> activation_shares(const Config& config, const Layout& layout) {
  const std::vector<MemoryEstimate> ranks = estimate_memory_by_rank(config, layout);
  const double budget = config.memory.device_budget_gb * 1024.0 * 1024.0 * 1024.0;
  std::vector<ActivationShare> shares;
  for (size_t r = 0; r < ranks.size(); ++r) {
    const MemoryEstimate& e = ranks[r];
    ActivationShare share;
    share.pipeline_rank = e.pipeline_rank;
    if (layout.pipelined()) {
      const ModelStage stage = layout.stage_of(static_cast<int64_t>(r));
      const double chunks = static_cast<double>(stage.chunks.size());
      share.layers = stage.layers(config.model);
      share.held = static_cast<double>(e.pipeline_held) / chunks;
      share.moments.clear();
      // The schedule's moments by how many of the held micro-batches await their W.
      for (const auto* by_awaiting : {&e.pipeline_held_before_gradients, &e.pipeline_held_with_gradients})
        for (size_t k = 0; k < by_awaiting->size(); ++k)
          if ((*by_awaiting)[k] >= 0)
            share.moments.push_back({static_cast<double>((*by_awaiting)[k] - static_cast<int64_t>(k)) / chunks,
                                     static_cast<double>(k) / chunks});
      share.groups_in_flight = 3;
    } else {
      for (int64_t l = 0; l < config.model.n_layer; ++l) share.layers.push_back(l);
    }
    const double state = e.parameter_bytes + e.gradient_bytes + (e.optimizer_on_host ? 0 : e.optimizer_bytes) +
                         e.working_bytes + e.in_flight_bytes;
    require(budget > state, "memory.device_budget_gb = ", config.memory.device_budget_gb, " (", format_bytes(budget),
            ") does not hold the model's state on the device", rank_name(share), ", ", format_bytes(state),
            " (parameters, gradients, optimizer state and the backward's working set; `tessera inspect` shows them)");
    share.budget_bytes = budget - state;
    shares.push_back(std::move(share));
  }
  return shares;
}

void check_activation_budget(const Config& config, const ParallelDims& dims, double device_capacity_bytes) {
  const double budget = config.memory.device_budget_gb * 1024.0 * 1024.0 * 1024.0;
  require(device_capacity_bytes <= 0 || budget <= device_capacity_bytes, "memory.device_budget_gb = ",
          config.memory.device_budget_gb, " exceeds the device's ", format_bytes(device_capacity_bytes));
  // Under swap the budget is shared with the swap plan's sub-models: chosen and refused with the
  // plan once the blocks are measured (plan/swap_policy.h).
  if (config.memory.swap) return;
  for (const ActivationShare& share : activation_shares(config, make_layout(config, dims))) {
    const double room = share.budget_bytes, smallest = smallest_activation_bytes(config, dims, share);
    require(room >= smallest, "memory.device_budget_gb = ", config.memory.device_budget_gb, " leaves ",
            format_bytes(room), " for the blocks' activations after the model's state", rank_name(share),
            ", but the smallest activation policy (every block offloaded, whole or as the input it recomputes from, "
            "encoded where memory.activation_compression allows) needs ", format_bytes(smallest),
            share.held > 1 ? " for the micro-batches the schedule holds" : " per micro-batch",
            ": raise memory.device_budget_gb, or lower train.batch_size or train.seq_len");
  }
}

}  // namespace tessera
