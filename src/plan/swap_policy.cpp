// The activation policy under swap (swap_policy.h).
#include "plan/swap_policy.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "core/error.h"
#include "memory/swap/swap_simulate.h"

namespace tessera {

SwappedActivationPolicy choose_swapped_activation_policy(const Config& config, const ParallelDims& dims,
                                                         const BlockCosts& measured, const SwapCosts& costs,
                                                         bool cpu_device) {
  const auto options = activation_options(config, dims, measured, cpu_device);
  double largest = 0;
  for (const auto& block : options) {
    double most = 0;
    for (const ActivationOption& o : block) most = std::max(most, o.bytes + o.group);
    largest += most;
  }
  SwappedActivationPolicy best;
  best.step_s = std::numeric_limits<double>::infinity();
  std::set<std::vector<std::string>> seen;
  std::string last_refusal;
  for (int64_t i = 0; i <= 24; ++i) {
    const double allowance = largest * std::pow(0.5, static_cast<double>(i) / 2);
    ActivationPolicy policy;
    try {
      policy = choose_activation_policy(options, allowance);
    } catch (const Error&) {
      break;  // smaller allowances fit no policy either
    }
    std::vector<std::string> names;
    for (const ActivationOption& o : policy.blocks) names.push_back(o.name());
    if (!seen.insert(names).second) continue;
    SwapCosts priced = costs;
    double offloaded_group = 0, recomputed_whole = 0;
    for (size_t l = 0; l < policy.blocks.size(); ++l) {
      const ActivationOption& o = policy.blocks[l];
      priced.blocks[l].activation_bytes = o.bytes;
      priced.blocks[l].backward_s += o.seconds;
      if (o.offload) offloaded_group = std::max(offloaded_group, o.group);
      if (o.checkpointing == "full") recomputed_whole = std::max(recomputed_whole, options[l].front().bytes);
    }
    priced.reserved_bytes = static_cast<double>(policy.groups_in_flight) * offloaded_group + recomputed_whole;
    ++best.candidates;
    try {
      swap::SwapPlan plan = plan_swap(config, priced, dims.dp());
      const double step = swap::simulate_swap_plan(plan).step_time;
      if (step < best.step_s) {
        best.step_s = step;
        best.plan = std::move(plan);
        best.policy = std::move(policy);
      }
    } catch (const Error& e) {
      last_refusal = e.what();
    }
  }
  require(std::isfinite(best.step_s), "memory.device_budget_gb = ", config.memory.device_budget_gb,
          " with memory.swap = true and memory.activation_policy = auto: no activation policy leaves a swap plan "
          "that fits (", best.candidates, " tried",
          last_refusal.empty() ? std::string() : "; the smallest's plan: " + last_refusal,
          "); raise memory.device_budget_gb, or lower train.batch_size or train.seq_len");
  best.policy.with_swap_plan = true;
  best.policy.layers.clear();
  for (int64_t l = 0; l < config.model.n_layer; ++l) best.policy.layers.push_back(l);
  return best;
}

}  // namespace tessera
