// Measuring a run's swap costs and planning its cut (swap_cut.h).
#include "plan/swap_cut.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include <ATen/ATen.h>
#include <torch/cuda.h>

#include "core/byte_size.h"
#include "core/error.h"
#include "memory/swap/swap_partition.h"
#include "memory/swap/swap_simulate.h"
#include "model/transformer.h"
#include "optim/clipping.h"
#include "optim/state_size.h"
#include "optim/optimizer.h"
#include "plan/activation_estimate.h"
#include "plan/memory_estimate.h"
#include "plan/profile_cut.h"

namespace tessera {
namespace {

// Host seconds per parameter of what the swap engine's host does with each parameter in a step,
// the median of three after a warm-up, timed on a tensor of `numel` with fresh gradients each time:
// `update`, SwapOwner::update (the optimizer's step, and the refresh of the bf16 copy when the link
// carries copies); `gradients`, SwapOwner::gradients_stored (the norm over the host gradients and,
// under clipping, their scaling). Timing the optimizer's step alone priced a GPT-2 124M swap's
// host work at half what it took on an H100's host (docs/gpu.md).
struct HostSeconds {
  double update = 0, gradients = 0;
};

HostSeconds host_seconds_per_parameter(const Config& config, int64_t numel) {
  at::Tensor p = at::randn({numel}, at::kFloat), g = at::empty({numel}, at::kFloat);
  const bool copies = config.memory.swap_bf16_copies(config.precision.dtype);
  at::Tensor copy = copies ? at::empty({numel}, at::kBFloat16) : at::Tensor();
  auto optimizer = make_optimizer(config.optim, {{"p", p}});
  using Clock = std::chrono::steady_clock;
  auto seconds = [](Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); };
  std::vector<double> update, gradients;
  for (int i = 0; i < 4; ++i) {
    g.normal_();  // above any clipping norm, so the scaling runs as it would
    const auto t0 = Clock::now();
    clip_gradients({g}, config.optim.grad_clip);
    const auto t1 = Clock::now();
    p.mutable_grad() = g;
    optimizer->step(1e-4);
    optimizer->zero_grad();
    if (copies) copy.copy_(p);
    const auto t2 = Clock::now();
    if (i == 0) continue;
    gradients.push_back(seconds(t0, t1));
    update.push_back(seconds(t1, t2));
  }
  std::sort(update.begin(), update.end());
  std::sort(gradients.begin(), gradients.end());
  return {update[1] / static_cast<double>(numel), gradients[1] / static_cast<double>(numel)};
}

// Bytes per second of a 64 MiB copy into freshly allocated memory on the CPU: the fastest a CPU
// "device"'s link can be whatever its modelled bandwidth (the copy is real; the median of three).
double measured_memcpy_bandwidth() {
  const int64_t n = 16 << 20;
  at::Tensor from = at::ones({n}, at::kFloat);
  std::vector<double> times;
  for (int i = 0; i < 3; ++i) {
    const auto start = std::chrono::steady_clock::now();
    at::Tensor to = at::empty({n}, at::kFloat);
    to.copy_(from);
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  return static_cast<double>(n) * 4 / times[1];
}

// Bytes per second of a pinned host-to-device copy of 64 MiB (CUDA).
double measured_bandwidth(c10::Device device) {
  const int64_t n = 16 << 20;
  at::Tensor host = at::empty({n}, at::TensorOptions().dtype(at::kFloat).pinned_memory(true));
  at::Tensor dev = at::empty({n}, at::TensorOptions().dtype(at::kFloat).device(device));
  dev.copy_(host);
  torch::cuda::synchronize(device.index());
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 3; ++i) dev.copy_(host, /*non_blocking=*/true);
  torch::cuda::synchronize(device.index());
  return 3.0 * n * 4 / std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

double recompute_reserve(const Config& config, const ParallelDims& dims) {
  if (config.memory.activation_checkpointing != "full") return 0;
  double largest = 0;
  for (int64_t l = 0; l < config.model.n_layer; ++l) largest = std::max(largest, recomputed_block_bytes(config, dims, l));
  return largest;
}

SwapCosts measure_swap_costs(const Config& config, c10::Device device) {
  const ModelOptions& m = config.model;
  SwapCosts c;
  c.blocks.resize(static_cast<size_t>(m.n_layer));
  const TransformerLM meta(m, ModelStage{}, at::TensorOptions().device(at::kMeta));
  int64_t largest = 0;
  std::vector<int64_t> numel(static_cast<size_t>(m.n_layer), 0);
  int64_t ends = 0;
  for (const auto& item : meta->named_parameters()) {
    const std::string& name = item.key();
    const int64_t block = meta->parameter_specs().at(name).block;
    if (block >= 0) numel[static_cast<size_t>(block)] += item.value().numel();
    else ends += item.value().numel();
  }
  for (int64_t n : numel) largest = std::max(largest, n);
  const HostSeconds host = host_seconds_per_parameter(config, std::max(largest, ends));
  const BlockCosts profile = profile_blocks(config, device);
  for (int64_t l = 0; l < m.n_layer; ++l) {
    swap::SubModel& b = c.blocks[static_cast<size_t>(l)];
    b.first = l;
    b.end = l + 1;
    b.parameter_bytes = b.gradient_bytes = 4.0 * static_cast<double>(numel[static_cast<size_t>(l)]);
    // At least the block's output, which stays as the next block's saved input (what full
    // checkpointing keeps; the profile counts what the block itself adds).
    b.activation_bytes = std::max(profile.block_activation_bytes[static_cast<size_t>(l)],
                                  4.0 * static_cast<double>(config.train.batch_size * config.train.seq_len * m.n_embd));
    double seconds = profile.block_seconds[static_cast<size_t>(l)];
    if (l == 0) seconds += profile.embedding_seconds;
    if (l + 1 == m.n_layer) seconds += profile.head_seconds;
    b.forward_s = seconds / 3;
    b.backward_s = 2 * seconds / 3;
    b.optim_s = host.update * static_cast<double>(numel[static_cast<size_t>(l)]);
  }
  double offloaded_largest = 0;
  for (int64_t l = 0; l < std::min(config.memory.activation_offload, m.n_layer); ++l) {
    swap::SubModel& b = c.blocks[static_cast<size_t>(l)];
    offloaded_largest = std::max(offloaded_largest, b.activation_bytes);
    b.activation_bytes = 0;
  }
  c.reserved_bytes =
      static_cast<double>(std::min<int64_t>(config.memory.activation_offload, 2)) * offloaded_largest +
      recompute_reserve(config, ParallelDims(config.parallel, std::max<int64_t>(config.parallel.dp, 1), "memory.swap"));
  c.ends.parameter_bytes = c.ends.gradient_bytes = 4.0 * static_cast<double>(ends);
  c.ends.optim_s = host.update * static_cast<double>(ends);
  int64_t total = ends;
  for (int64_t n : numel) total += n;
  c.gradients_stored_s = host.gradients * static_cast<double>(total);
  c.bandwidth = device.is_cuda() ? measured_bandwidth(device)
                                 : std::min(config.memory.modelled_bandwidth_gbps * 1e9, measured_memcpy_bandwidth());
  require(device.is_cuda() || config.memory.modelled_bandwidth_gbps > 0, "memory.modelled_bandwidth_gbps = 0 (unthrottled) leaves the swap planner no link to "
          "plan with; give the bandwidth to model");
  return c;
}

swap::SwapPlan plan_swap(const Config& config, const SwapCosts& costs, int64_t dp) {
  swap::SwapPlan shape;
  shape.ends = costs.ends;
  shape.device_budget_bytes = config.memory.device_budget_gb * 1024.0 * 1024.0 * 1024.0 - costs.reserved_bytes;
  shape.reserved_bytes = costs.reserved_bytes;
  shape.bandwidth = costs.bandwidth;
  shape.micro_batches = config.train.accumulation(dp);
  shape.defer_optim = config.optim.grad_clip > 0 || dp > 1;
  shape.load_fraction = config.memory.swap_bf16_copies(config.precision.dtype) ? 0.5 : 1.0;
  shape.gradients_stored_s = costs.gradients_stored_s;
  const std::vector<int64_t>& hand = config.memory.swap_blocks;
  if (hand.empty()) return swap::partition_swap_plan(costs.blocks, shape);
  std::vector<int64_t> boundaries{0};
  for (int64_t b : hand) boundaries.push_back(boundaries.back() + b);
  return swap::cut_swap_plan(costs.blocks, shape, boundaries);
}

SwapHostMemory swap_host_memory(const Config& config, const swap::SwapPlan& plan) {
  SwapHostMemory h;
  double largest = plan.ends.parameter_bytes;
  for (const swap::SubModel& s : plan.subs) {
    h.masters += s.parameter_bytes;
    largest = std::max(largest, s.parameter_bytes);
  }
  h.masters += plan.ends.parameter_bytes;
  h.gradients = h.masters;
  h.staging = largest;
  const TransformerLM meta(config.model, ModelStage{}, at::TensorOptions().device(at::kMeta));
  for (const auto& item : meta->named_parameters()) h.optimizer += optimizer_state_bytes(config.optim, item.value());
  if (config.train.device == "cpu") h.device = plan.device_budget_bytes;
  if (plan.load_fraction < 1) h.copies = h.masters * plan.load_fraction;  // the bf16 mirror
  return h;
}

void check_swap_host_memory(const Config& config, const swap::SwapPlan& plan, double available_bytes) {
  const SwapHostMemory h = swap_host_memory(config, plan);
  if (available_bytes <= 0 || h.total() <= available_bytes) return;
  fail("memory.swap = true: the model's training state needs ", format_bytes(h.total()), " of host memory (masters ",
       format_bytes(h.masters), ", gradients ", format_bytes(h.gradients), ", staging ", format_bytes(h.staging), ", bf16 copies ",
       format_bytes(h.copies), ", optimizer state (",
       config.optim.name, ") ", format_bytes(h.optimizer), config.train.device == "cpu" ? ", the CPU device's budget " + format_bytes(h.device) : "",
       "), but this host has ", format_bytes(available_bytes), " available; train a smaller model (model.n_layer, model.n_embd)",
       config.optim.name == "adamw" ? ", use optim.name = \"adafactor\" (factored state)" : "",
       " or a host with more memory");
}

std::string describe_swap_plan(const swap::SwapPlan& plan) {
  std::string out;
  char line[256];
  std::snprintf(line, sizeof line, "swap plan: %lld sub-models, %lld micro-batches, budget %s, link %.2f GB/s (%s "
                "copies)%s\n", static_cast<long long>(plan.size()), static_cast<long long>(plan.micro_batches),
                format_bytes(plan.device_budget_bytes).c_str(), plan.bandwidth / 1e9, plan.load_fraction < 1 ? "bf16" : "fp32",
                plan.defer_optim ? ", updates after the clipping norm" : ", updates overlapped with backward");
  out += line;
  std::snprintf(line, sizeof line, "  ends (wte, wpe, ln_f): %s parameters + %s gradients, resident for the step\n",
                format_bytes(plan.ends.parameter_bytes).c_str(), format_bytes(plan.ends.gradient_bytes).c_str());
  out += line;
  for (int64_t i = 0; i < plan.size(); ++i) {
    const swap::SubModel& s = plan.subs[static_cast<size_t>(i)];
    std::snprintf(line, sizeof line,
                  "  sub-model %lld: blocks %lld-%lld, %s parameters, %s activations, forward %.2f ms, backward %.2f "
                  "ms, load %.2f ms, update %.2f ms\n",
                  static_cast<long long>(i), static_cast<long long>(s.first), static_cast<long long>(s.end - 1),
                  format_bytes(s.parameter_bytes).c_str(), format_bytes(s.activation_bytes).c_str(), 1000 * s.forward_s,
                  1000 * s.backward_s, 1000 * s.parameter_bytes * plan.load_fraction / plan.bandwidth, 1000 * s.optim_s);
    out += line;
  }
  const swap::SwapTimeline t = swap::simulate_swap_plan(plan);
  std::snprintf(line, sizeof line,
                "  device peak (parameters, gradients, activations) %s; predicted step %.2f ms: compute %.2f ms, "
                "loads %.2f ms of which %.2f ms exposed (%.0f%% hidden)\n",
                format_bytes(swap::occupancy(plan).peak).c_str(), 1000 * t.step_time, 1000 * t.compute_time,
                1000 * t.load_time, 1000 * t.exposed_load, 100 * t.overlap());
  out += line;
  return out;
}

}  // namespace tessera
