// The profiling pass of parallel.pp_cut = profile (profile_cut.h).
#include "plan/profile_cut.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>

#include <ATen/ATen.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include "core/error.h"
#include "memory/host_memory_stats.h"
#include "precision/autocast.h"
#include "precision/precision_options.h"

namespace tessera {
namespace {

void sync_device(const c10::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

// Bytes the device's allocator holds now.
double allocated_on(const c10::Device& device) {
  if (device.is_cuda())
    return static_cast<double>(
        c10::getDeviceAllocator(c10::DeviceType::CUDA)->getDeviceStats(device.index()).allocated_bytes[0].current);
  return static_cast<double>(host_memory::current());
}

// The median of three timed runs of `pass`, after one warm-up.
double median_seconds(const c10::Device& device, const std::function<void()>& pass) {
  pass();
  std::vector<double> times;
  for (int i = 0; i < 3; ++i) {
    sync_device(device);
    const auto start = std::chrono::steady_clock::now();
    pass();
    sync_device(device);
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  return times[1];
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
  std::map<std::string, std::pair<double, double>> by_kind;  // kind -> (seconds, activation bytes)
  for (int64_t l = 0; l < m.n_layer; ++l) {
    TransformerLM part = build(l, l + 1);
    const std::string kind = block_kind(part, l);
    auto known = by_kind.find(kind);
    if (known == by_kind.end()) {
      const at::Tensor x = at::randn({B, T, m.n_embd}, on_device.dtype(at::kFloat)).requires_grad_(true);
      BlockOutput out;
      auto forward = [&]() { under_autocast([&] { out = part->run_blocks(x, l, l + 1); }); };
      auto root = [&]() { return out.x.to(at::kFloat).sum() + out.aux_loss; };
      const double seconds = median_seconds(device, [&] {
        forward();
        root().backward();
      });
      sync_device(device);
      const double before = allocated_on(device);
      forward();
      sync_device(device);
      const double bytes = std::max(0.0, allocated_on(device) - before);
      out = BlockOutput();
      known = by_kind.emplace(kind, std::make_pair(seconds, bytes)).first;
    }
    costs.block_seconds.push_back(known->second.first);
    costs.block_activation_bytes.push_back(known->second.second);
  }
  {
    TransformerLM first = build(0, 1);
    costs.embedding_seconds = median_seconds(device, [&] {
      at::Tensor x;
      under_autocast([&] { x = first->embed(tokens); });
      x.to(at::kFloat).sum().backward();
    });
  }
  {
    TransformerLM last = build(m.n_layer - 1, m.n_layer);
    const at::Tensor x = at::randn({B, T, m.n_embd}, on_device.dtype(at::kFloat)).requires_grad_(true);
    const at::Tensor aux = at::zeros({}, on_device.dtype(at::kFloat));
    costs.head_seconds = median_seconds(device, [&] {
      ModelOutput out;
      under_autocast([&] { out = last->head(x, tokens, aux); });
      out.loss.to(at::kFloat).backward();
    });
  }
  return costs;
}

BlockCosts profile_world_blocks(const Config& config, comm::Mesh& mesh) {
  const BlockCosts mine = profile_blocks(config, mesh.device());
  const int64_t L = config.model.n_layer;
  // [block seconds (L), block activation bytes (L), embedding, head], averaged over the world.
  at::Tensor packed = at::empty({2 * L + 2}, at::kDouble);
  auto a = packed.accessor<double, 1>();
  for (int64_t l = 0; l < L; ++l) {
    a[l] = mine.block_seconds[l];
    a[L + l] = mine.block_activation_bytes[l];
  }
  a[2 * L] = mine.embedding_seconds;
  a[2 * L + 1] = mine.head_seconds;
  mesh.world().all_reduce(packed);
  packed.div_(static_cast<double>(mesh.world_size()));
  BlockCosts mean;
  for (int64_t l = 0; l < L; ++l) {
    mean.block_seconds.push_back(a[l]);
    mean.block_activation_bytes.push_back(a[L + l]);
  }
  mean.embedding_seconds = a[2 * L];
  mean.head_seconds = a[2 * L + 1];
  return mean;
}

}  // namespace tessera
