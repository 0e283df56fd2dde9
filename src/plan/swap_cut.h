// The swap plan of a run (memory.swap = true; ATOM, issue 14): what each block costs, measured on
// the device the run trains on, and where the model is cut into sub-models.
//
// measure_swap_costs: per block, its parameters and gradients (float32, counted from the model's
// declarations on the meta device: nothing is allocated), its forward and backward time and its
// activation bytes per micro-batch (plan/profile_cut.h's profile_blocks: forward + backward split
// 1 : 2; activations at least the block's float32 output, which the next block keeps), the embedding's and the head's time folded into the first and last block; the ends'
// bytes (wte, wpe, ln_f); the host's time per parameter for an update (optim.name's step and the
// bf16 copy's refresh) and for the pass over the gradients (norm, clipping), measured on a tensor
// the size of the largest block or the ends; the link's bandwidth: on CUDA measured
// (a 64 MiB pinned host-to-device copy), on a CPU device memory.modelled_bandwidth_gbps or, where
// lower, the measured speed of a 64 MiB copy into fresh memory (the CPU link's copies are real
// memcpy, which no modelled bandwidth can beat).
//
// plan_swap: the plan for this rank's micro-batches (the updates deferred under clipping or dp)
// cut by memory.swap_blocks when given, else by the partitioner (memory/swap/swap_partition.h),
// under memory.device_budget_gb. Refusals name the key.
#pragma once

#include <vector>

#include <c10/core/Device.h>

#include "core/parallel_dims.h"
#include "memory/swap/swap_plan.h"
#include "config/config.h"

namespace tessera {

struct SwapCosts {
  std::vector<swap::SubModel> blocks;  // one per block
  swap::SubModel ends;
  double bandwidth = 0;           // bytes per second
  double gradients_stored_s = 0;  // the host's pass over every gradient (swap::SwapPlan's)
  // Device memory the sub-models' count leaves out and plan_swap keeps out of the budget. With
  // memory.activation_offload the offloaded blocks hold no activations from forward to backward
  // (their SubModel's activation_bytes are 0); two of them are in flight on the device at a time
  // (memory/activation_offload.h). Under the activation policy (plan/swap_policy.h): its
  // reserves, the offloaded groups in flight and a fully recomputed block's whole activations; with
  // full checkpointing chosen by hand, the same recomputed block's (recompute_reserve below).
  double reserved_bytes = 0;
};

SwapCosts measure_swap_costs(const Config& config, c10::Device device);

// Under memory.activation_checkpointing = full (chosen by hand; the activation policy reserves its
// own, plan/swap_policy.h) the largest block's whole activations, which its backward's
// recomputation holds beside the plan's sub-models (plan/activation_estimate.h); 0 otherwise.
double recompute_reserve(const Config& config, const ParallelDims& dims);

// `dp`: data-parallel replicas (each accumulates its share of the micro-batches; with dp > 1 the
// updates wait for the reduction, as for clipping).
swap::SwapPlan plan_swap(const Config& config, const SwapCosts& costs, int64_t dp = 1);

// The host memory a swapped run holds (swap_owner.h): the float32 masters and gradients, the
// staging buffer (the largest sub-model), the bf16 copies of the masters (memory.swap_copies), the
// optimizer state (AdamW: exp_avg and exp_avg_sq; SGD with momentum: momentum_buffer;
// Adafactor: its factored rows and columns, or a full second moment for vectors, plus exp_avg
// with adafactor_beta1 > 0) and, on a CPU "device", the device budget, which is host memory too.
struct SwapHostMemory {
  double masters = 0, gradients = 0, staging = 0, copies = 0, optimizer = 0, device = 0;
  double total() const { return masters + gradients + staging + copies + optimizer + device; }
};
SwapHostMemory swap_host_memory(const Config& config, const swap::SwapPlan& plan);
// Refuses, before anything is allocated, a swapped run whose host memory exceeds
// `available_bytes` (0: unknown, nothing refused), naming memory.swap and the terms.
void check_swap_host_memory(const Config& config, const swap::SwapPlan& plan, double available_bytes);

// "sub-model 0: blocks 0-3, 12.0 MiB ... predicted step 85.2 ms, 97% of loading hidden": the cut,
// each sub-model's bytes and times, the peak occupancy and the replay's prediction.
std::string describe_swap_plan(const swap::SwapPlan& plan);

}  // namespace tessera
