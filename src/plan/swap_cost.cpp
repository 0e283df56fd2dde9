// A swapped layout's predicted step (swap_cost.h).
#include "plan/swap_cost.h"

#include <algorithm>

#include "core/error.h"
#include "memory/swap/swap_simulate.h"
#include "plan/activation_estimate.h"
#include "plan/layout.h"
#include "plan/memory_estimate.h"
#include "plan/swap_cut.h"
#include "plan/swap_policy.h"

namespace tessera::plan {

SwapStep predict_swap_step(const Config& config, const ParallelDims& dims, const Cluster& cluster,
                           const PricedOperations& priced) {
  require(dims.world_size() == dims.dp(), "tessera plan: memory.swap trains data-parallel replicas only (",
          dims.describe(), ")");
  require(cluster.host.optimizer_gbs > 0 && cluster.host.device_link_gbs > 0, cluster.source,
          ": memory.swap needs host.optimizer_gbs and host.device_link_gbs, which this cluster file leaves at 0");
  const ModelOptions& model = config.model;
  const double host_rate = 1e9 * cluster.host.optimizer_gbs;
  const bool copies = config.memory.swap_bf16_copies(config.precision.dtype);
  const double update_per_element = (optimizer_bytes_per_element(config) + (copies ? 6 : 0)) / host_rate;
  const double activations = estimate_memory(config, make_layout(config, dims)).activation_bytes_per_micro_batch /
                             static_cast<double>(model.n_layer);
  SwapCosts costs;
  const double elements = priced.total().parameters;
  for (int64_t l = 0; l < model.n_layer; ++l) {
    const PartCost& c = priced.blocks[static_cast<size_t>(l)];
    swap::SubModel b;
    b.first = l, b.end = l + 1;
    b.parameter_bytes = b.gradient_bytes = 4 * c.parameters;
    b.activation_bytes = activations;
    b.forward_s = c.f, b.backward_s = c.i + c.w;
    if (l == 0) b.forward_s += priced.embedding.f, b.backward_s += priced.embedding.i + priced.embedding.w;
    if (l + 1 == model.n_layer) b.forward_s += priced.head.f, b.backward_s += priced.head.i + priced.head.w;
    b.optim_s = update_per_element * c.parameters;
    costs.blocks.push_back(b);
  }
  costs.ends.parameter_bytes = costs.ends.gradient_bytes = 4 * (priced.embedding.parameters + priced.head.parameters);
  costs.ends.optim_s = update_per_element * (priced.embedding.parameters + priced.head.parameters);
  costs.gradients_stored_s = 12 * elements / host_rate;
  costs.reserved_bytes = recompute_reserve(config, dims);
  // On a CPU "device" a run throttles its copies to memory.modelled_bandwidth_gbps (swap_cut.h).
  costs.bandwidth = 1e9 * cluster.host.device_link_gbs;
  if (cluster.device.kind == "cpu" && config.memory.modelled_bandwidth_gbps > 0)
    costs.bandwidth = std::min(costs.bandwidth, 1e9 * config.memory.modelled_bandwidth_gbps);

  SwapStep out;
  if (config.memory.activation_policy == "auto") {
    SwappedActivationPolicy chosen = choose_swapped_activation_policy(
        config, dims, predicted_block_costs(config, cluster, priced.memory_slowdown, priced.blocks), costs,
        cluster.device.kind == "cpu");
    out.plan = std::move(chosen.plan);
    out.activation_policy = std::move(chosen.policy);
  } else {
    out.plan = plan_swap(config, costs, dims.dp());
  }
  const std::vector<int64_t> replicas = dims.group_of("dp", 0);
  out.reduce_s = all_reduce_seconds(4 * elements, static_cast<int64_t>(replicas.size()), cluster.tier(replicas));
  out.step_s = swap::simulate_swap_plan(out.plan).step_time + out.reduce_s;
  // The plan's occupancy counts its sub-models' parameters, gradients and activations; the
  // backward's own tensors come on top (plan/activation_estimate.h).
  out.peak_device_bytes = swap::occupancy(out.plan).peak + backward_working_bytes(config, dims, true, true).larger();
  const SwapHostMemory host = swap_host_memory(config, out.plan);
  out.host_bytes = host.total() - host.device;
  return out;
}

}  // namespace tessera::plan
