// The swap engine on a CUDA device: real copy streams, events and pinned host buffers. A swapped
// run equals the resident run on the same GPU (3 steps, 3 sub-models, 2 micro-batches, clipping)
// within 1e-5 (the embedding's backward accumulates with atomics on CUDA, so runs need not be
// bitwise equal), and the device never holds more than the budget plus the activations the plan
// counts: the caching allocator's peak stays under memory.device_budget_gb. Skipped without CUDA
// (passes on the lent H100s and H200s, docs/gpu.md).
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <c10/core/CachingDeviceAllocator.h>

#include "tiny_config.h"
#include "train/train_step.h"

namespace tessera {
namespace {

Config gpu_config(bool swapped) {
  Config c = test::tiny_config(16);
  c.model.n_layer = 4;
  c.model.bias = false;
  c.train.device = "cuda";
  c.train.grad_accum = 2;
  c.optim.grad_clip = 1.0;
  if (swapped) {
    c.memory.swap = true;
    c.memory.device_budget_gb = 0.25;
    c.memory.swap_blocks = {1, 2, 1};
  }
  return c;
}

TEST(GpuSwap, MatchesResidentOnTheGpuWithinTheBudget) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  std::map<std::string, at::Tensor> params[2];
  for (const bool swapped : {false, true}) {
    const Config c = gpu_config(swapped);
    auto* allocator = c10::getDeviceAllocator(c10::DeviceType::CUDA);
    allocator->emptyCache();
    allocator->resetPeakStats(0);
    TrainStep step(c);
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(5);
    for (int s = 0; s < 3; ++s) {
      std::vector<Batch> micro;
      for (int m = 0; m < 2; ++m) {
        const at::Tensor t = at::randint(c.model.vocab_size, {2, 17}, gen, at::kLong);
        micro.push_back({t.narrow(1, 0, 16).contiguous(), t.narrow(1, 1, 16).contiguous()});
      }
      step.run(micro, 1e-3);
    }
    if (swapped) {
      const double peak = static_cast<double>(allocator->getDeviceStats(0).allocated_bytes[0].peak);
      EXPECT_LE(peak, c.memory.device_budget_gb * 1024 * 1024 * 1024) << "device peak of the swapped run";
    }
    for (const auto& [name, t] : step.model_state()) params[swapped][name] = t.to(at::kCPU, at::kFloat);
  }
  for (const auto& [name, p] : params[0])
    EXPECT_TRUE(at::allclose(params[1].at(name), p, 1e-5, 1e-6)) << name;
}

}  // namespace
}  // namespace tessera
