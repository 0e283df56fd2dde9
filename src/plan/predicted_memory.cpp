// A prediction's memory (cost_model.h's add_memory): the device peak and the host's share, from
// the memory estimate, the activation policy or the swap plan.
#include <algorithm>

#include "plan/cost_model.h"
#include "plan/layout.h"
#include "plan/memory_estimate.h"
#include "plan/swap_cost.h"

namespace tessera::plan {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

}  // namespace

void add_memory(Prediction& prediction, const Config& config, const ParallelDims& dims, const Cluster& cluster) {
  add_memory(prediction, config, make_layout(config, dims), cluster);
}

void add_memory(Prediction& prediction, const Config& config, const Layout& layout, const Cluster& cluster) {
  // What each rank keeps in host memory (offloaded optimizer state; a swapped model's whole
  // training state) x the node's ranks must fit the host too, where the file gives its memory.
  const double ranks_on_host = static_cast<double>(std::min(layout.dims().world_size(), cluster.cluster.devices_per_node));
  double host_bytes = 0;
  if (config.memory.swap) {
    const SwapStep swapped = predict_swap_step(config, layout.dims(), cluster,
                                               price_operations(config, layout.dims(), cluster));
    prediction.peak_memory_bytes = swapped.peak_device_bytes;
    host_bytes = swapped.host_bytes;
    if (swapped.activation_policy) prediction.activation_policies = {*swapped.activation_policy};
  } else {
    const MemoryEstimate estimate = estimate_memory(config, layout);
    prediction.peak_memory_bytes = estimate.device_bytes();
    host_bytes = estimate.host_bytes();
    if (config.memory.activation_policy == "auto") {
      // Each rank's model state (the budget less its share) and its policy's bytes.
      prediction.activation_policies = price_operations(config, layout.dims(), cluster).activation_policies;
      prediction.peak_memory_bytes = 0;
      for (const ActivationPolicy& policy : prediction.activation_policies)
        prediction.peak_memory_bytes = std::max(prediction.peak_memory_bytes, config.memory.device_budget_gb * kGiB -
                                                                                   policy.budget_bytes + policy.bytes);
    }
  }
  // A CPU "device" is host memory: what the run keeps "on the host" is in the same memory.
  if (cluster.device.kind == "cpu") prediction.peak_memory_bytes += host_bytes;
  prediction.fits = prediction.peak_memory_bytes <= cluster.device.memory_bytes() &&
                    (cluster.host.memory_gib <= 0 || host_bytes * ranks_on_host <= cluster.host.memory_gib * kGiB);
  prediction.memory_estimated = true;
}

}  // namespace tessera::plan
