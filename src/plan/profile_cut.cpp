// The profiling pass of parallel.pp_cut = profile (profile_cut.h).
#include "plan/profile_cut.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>

#include <ATen/ATen.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <torch/cuda.h>
#include <torch/autograd.h>
#include <torch/cuda.h>
#include <torch/utils.h>

#include "core/error.h"
#include "memory/activation_codec.h"
#include "memory/host_memory_stats.h"
#include "parallel/pipeline/split_backward.h"
#include "plan/activation_estimate.h"
#include "plan/calibrate_timing.h"
#include "precision/autocast.h"
#include "precision/precision_options.h"

namespace tessera {
namespace {

void sync_device(const c10::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

// The median of five timings of `fn` (calibration's, plan/calibrate_timing.h), the device
// synchronized after each.
double median_seconds(const c10::Device& device, const std::function<void()>& fn) {
  sync_device(device);
  return plan::calibration::median_seconds(
      [&] {
        fn();
        sync_device(device);
      },
      0);
}

// Bytes the device's allocator holds now.
double allocated_on(const c10::Device& device) {
  if (device.is_cuda())
    return static_cast<double>(
        c10::getDeviceAllocator(c10::DeviceType::CUDA)->getDeviceStats(device.index()).allocated_bytes[0].current);
  return static_cast<double>(host_memory::current());
}

// What one micro-batch's pass through a part of the model gives the split backward: the root to
// differentiate and the input I stops at.
struct Pass {
  at::Tensor root, input;
};

// Forward, input gradient and weight gradients of one micro-batch as the pipeline splits them
// (parallel/pipeline/split_backward.h), and the whole backward B of a second forward (which the
// split's two halves exceed by what computing them apart costs: the zero-bubble tables weigh it),
// each the median of three timed runs after a warm-up. On CUDA, where a run takes milliseconds
// and the first ones after start-up run while the clocks ramp (F of one stage measured 2.90 and
// 1.97 ms in two processes on an H100), the median of seven after three warm-ups.
pipeline::ActionCosts::Compute split_seconds(const c10::Device& device, const std::function<Pass()>& forward,
                                             const std::vector<at::Tensor>& params) {
  using Clock = std::chrono::steady_clock;
  auto seconds = [](Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); };
  std::vector<double> f, i, w, b;
  const int warmups = device.is_cuda() ? 3 : 1, runs = warmups + (device.is_cuda() ? 7 : 3);
  for (int run = 0; run < runs; ++run) {
    sync_device(device);
    const auto t0 = Clock::now();
    const Pass pass = forward();
    sync_device(device);
    const auto t1 = Clock::now();
    pipeline::SplitBackward split({pass.root}, {at::ones_like(pass.root)}, pass.input, params);
    sync_device(device);
    const auto t2 = Clock::now();
    split.weight_gradients();
    sync_device(device);
    const auto t3 = Clock::now();
    const Pass whole = forward();
    sync_device(device);
    const auto t4 = Clock::now();
    torch::autograd::backward({whole.root}, {at::ones_like(whole.root)});
    sync_device(device);
    const auto t5 = Clock::now();
    if (run < warmups) continue;
    f.push_back(seconds(t0, t1));
    i.push_back(seconds(t1, t2));
    w.push_back(seconds(t2, t3));
    b.push_back(seconds(t4, t5));
  }
  auto median = [](std::vector<double>& v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  pipeline::ActionCosts::Compute c;
  c.f = median(f), c.i = median(i), c.w = median(w), c.b = median(b);
  return c;
}

std::vector<at::Tensor> trained(const TransformerLM& part) {
  std::vector<at::Tensor> out;
  for (const at::Tensor& p : part->parameters())
    if (p.requires_grad()) out.push_back(p);
  return out;
}

// Block `layer`'s parameters as "name shape; ..." without the block's index: equal for blocks
// that compute alike.
std::string block_kind(const TransformerLM& model, int64_t layer) {
  std::string kind;
  for (const auto& item : model->block(layer)->named_parameters()) {
    kind += item.key() + "[";
    for (int64_t d : item.value().sizes()) kind += std::to_string(d) + ",";
    kind += "];";
  }
  return kind;
}

}  // namespace

BlockCosts profile_blocks(const Config& config, c10::Device device) {
  const ModelOptions& m = config.model;
  if (device.is_cpu()) host_memory::install();
  const std::optional<at::ScalarType> autocast = autocast_dtype(config.precision);
  const int64_t B = config.train.batch_size, T = config.train.seq_len;
  torch::manual_seed(static_cast<uint64_t>(config.train.seed));
  // One stage of the model on the device, as the run would hold it.
  auto build = [&](int64_t first, int64_t end) {
    TransformerLM part(m, ModelStage(first, end));
    part->to(device, parameter_dtype(config.precision));
    part->set_activation_checkpointing(config.memory.activation_checkpointing);
    part->set_activation_compression(activation_codec_name(applied_activation_codec(config)));
    part->set_attention_compression(config.memory.attention_compression);
    part->train();
    return part;
  };
  auto under_autocast = [&](const std::function<void()>& fn) {
    AutocastGuard guard(device.type(), autocast.value_or(at::kFloat), autocast.has_value());
    fn();
  };
  const at::TensorOptions on_device = at::TensorOptions().device(device);
  const at::Tensor tokens = at::randint(m.vocab_size, {B, T}, on_device.dtype(at::kLong));
  BlockCosts costs;
  // kind -> (F, B, I, W; activation bytes)
  std::map<std::string, std::pair<pipeline::ActionCosts::Compute, double>> by_kind;
  for (int64_t l = 0; l < m.n_layer; ++l) {
    TransformerLM part = build(l, l + 1);
    const std::string kind = block_kind(part, l);
    auto known = by_kind.find(kind);
    if (known == by_kind.end()) {
      const at::Tensor x = at::randn({B, T, m.n_embd}, on_device.dtype(at::kFloat)).requires_grad_(true);
      BlockOutput out;
      auto forward = [&]() { under_autocast([&] { out = part->run_blocks(x, l, l + 1); }); };
      const pipeline::ActionCosts::Compute split = split_seconds(device, [&] {
        forward();
        return Pass{out.x.to(at::kFloat).sum() + out.aux_loss, x};
      }, trained(part));
      sync_device(device);
      const double before = allocated_on(device);
      forward();
      sync_device(device);
      const double bytes = std::max(0.0, allocated_on(device) - before);
      out = BlockOutput();
      known = by_kind.emplace(kind, std::make_pair(split, bytes)).first;
    }
    const auto& [split, bytes] = known->second;
    costs.block_split.push_back(split);
    costs.block_seconds.push_back(split.f + split.b);
    costs.block_activation_bytes.push_back(bytes);
  }
  {
    TransformerLM first = build(0, 1);
    costs.embedding_split = split_seconds(device, [&] {
      at::Tensor x;
      under_autocast([&] { x = first->embed(tokens); });
      return Pass{x.to(at::kFloat).sum(), x};  // stage 0's I stops at the embedding's output
    }, trained(first));
    costs.embedding_seconds = costs.embedding_split.f + costs.embedding_split.b;
  }
  {
    TransformerLM last = build(m.n_layer - 1, m.n_layer);
    const at::Tensor x = at::randn({B, T, m.n_embd}, on_device.dtype(at::kFloat)).requires_grad_(true);
    const at::Tensor aux = at::zeros({}, on_device.dtype(at::kFloat));
    costs.head_split = split_seconds(device, [&] {
      ModelOutput out;
      under_autocast([&] { out = last->head(x, tokens, aux); });
      return Pass{out.loss.to(at::kFloat), x};
    }, trained(last));
    costs.head_seconds = costs.head_split.f + costs.head_split.b;
  }
  if (device.is_cpu()) {
    // About a block's activations (16 floats per token and width, at most 64 MiB) copied onto
    // fresh pages, as offload's copies are: each copy kept until all are timed.
    const int64_t elements = std::min<int64_t>(B * T * m.n_embd * 16, int64_t{16} << 20);
    const at::Tensor from = at::randn({elements}, on_device.dtype(at::kFloat));
    std::vector<at::Tensor> copies;
    const double seconds = median_seconds(device, [&] { copies.push_back(at::empty_like(from).copy_(from)); });
    costs.copy_bytes_per_s = static_cast<double>(from.nbytes()) / std::max(seconds, 1e-9);
  } else {
    // The host link offload's copies cross: 64 MiB to pinned host memory and back, the slower way.
    const at::Tensor on = at::randn({int64_t{16} << 20}, on_device.dtype(at::kFloat));
    const at::Tensor host = at::empty_like(on, at::TensorOptions().device(at::kCPU).pinned_memory(true));
    const double down = median_seconds(device, [&] { host.copy_(on, true); });
    const double up = median_seconds(device, [&] { on.copy_(host, true); });
    costs.link_bytes_per_s = static_cast<double>(on.nbytes()) / std::max({down, up, 1e-9});
  }
  if (config.memory.activation_policy == "auto") {
    // Each allowed codec on an MLP's worth of activations ([B T, 4 n_embd] of the compute dtype, at
    // most 16M elements), encoded and decoded as a saved tensor is.
    const int64_t rows = std::max<int64_t>(1, std::min<int64_t>(B * T, (int64_t{4} << 20) / m.n_embd));
    const at::Tensor a = at::randn({rows, 4 * m.n_embd}, on_device.dtype(at::kFloat))
                             .to(autocast.value_or(parameter_dtype(config.precision)));
    for (ActivationCodec codec : encoding_codecs(config)) {
      const double seconds = plan::calibration::activation_codec_seconds(a, activation_codec_name(codec), 0,
                                                                         [&] { sync_device(device); });
      costs.codec_seconds_per_byte[activation_codec_name(codec)] = seconds / static_cast<double>(a.nbytes());
    }
  }
  return costs;
}

BlockCosts profile_world_blocks(const Config& config, comm::Mesh& mesh) {
  const BlockCosts mine = profile_blocks(config, mesh.device());
  const int64_t L = config.model.n_layer;
  // Per block and then the embedding and the head: F, B, I, W; then the blocks' activation bytes
  // and the copy rate; averaged over the world.
  std::vector<pipeline::ActionCosts::Compute> parts = mine.block_split;
  parts.push_back(mine.embedding_split);
  parts.push_back(mine.head_split);
  const int64_t copy_rate_at = 4 * (L + 2) + L;  // after them, the CPU's copy rate, the link's, each codec's
  const int64_t codecs = static_cast<int64_t>(mine.codec_seconds_per_byte.size());  // the same on every rank
  at::Tensor packed = at::empty({copy_rate_at + 2 + codecs}, at::kDouble);
  auto a = packed.accessor<double, 1>();
  for (int64_t k = 0; k < L + 2; ++k) {
    a[4 * k] = parts[k].f;
    a[4 * k + 1] = parts[k].b;
    a[4 * k + 2] = parts[k].i;
    a[4 * k + 3] = parts[k].w;
  }
  for (int64_t l = 0; l < L; ++l) a[4 * (L + 2) + l] = mine.block_activation_bytes[l];
  a[copy_rate_at] = mine.copy_bytes_per_s;
  a[copy_rate_at + 1] = mine.link_bytes_per_s;
  int64_t at_codec = copy_rate_at + 2;
  for (const auto& [codec, seconds] : mine.codec_seconds_per_byte) a[at_codec++] = seconds;
  mesh.world().all_reduce(packed);
  packed.div_(static_cast<double>(mesh.world_size()));
  for (int64_t k = 0; k < L + 2; ++k) parts[k] = {a[4 * k], a[4 * k + 1], a[4 * k + 2], a[4 * k + 3]};
  BlockCosts mean;
  for (int64_t l = 0; l < L; ++l) {
    mean.block_split.push_back(parts[l]);
    mean.block_seconds.push_back(parts[l].f + parts[l].b);
    mean.block_activation_bytes.push_back(a[4 * (L + 2) + l]);
  }
  mean.embedding_split = parts[L];
  mean.head_split = parts[L + 1];
  mean.embedding_seconds = mean.embedding_split.f + mean.embedding_split.b;
  mean.head_seconds = mean.head_split.f + mean.head_split.b;
  mean.copy_bytes_per_s = a[copy_rate_at];
  mean.link_bytes_per_s = a[copy_rate_at + 1];
  at_codec = copy_rate_at + 2;
  for (const auto& [codec, seconds] : mine.codec_seconds_per_byte) mean.codec_seconds_per_byte[codec] = a[at_codec++];
  return mean;
}

}  // namespace tessera
