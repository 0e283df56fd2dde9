// clip_gradients_queued on a GPU (optim/clipping.h): the norm stays on the device, and the
// device-computed coefficient clips exactly where the host rule does: below max_norm the
// gradients are unchanged, above it they are scaled as on the host, and a nonfinite norm leaves
// them as they were.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include <torch/cuda.h>
#include <torch/types.h>
#include <torch/utils.h>

#include "optim/clipping.h"

namespace tessera {
namespace {

std::vector<at::Tensor> host_grads() {
  torch::manual_seed(7);
  return {torch::randn({64, 33}) * 3, torch::randn({33}), torch::randn({5, 2, 9}) * 0.5};
}

std::vector<at::Tensor> on(const std::vector<at::Tensor>& grads, const c10::Device& device) {
  std::vector<at::Tensor> out;
  for (const auto& g : grads) out.push_back(g.to(device).clone());
  return out;
}

TEST(GpuClipping, QueuedNormMatchesTheHostAndClipsAlike) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const c10::Device cuda(c10::kCUDA, 0);
  std::vector<at::Tensor> probe = host_grads();
  const double norm = clip_gradients(probe, 0);
  for (const double max_norm : {0.0, 2 * norm, norm / 3}) {
    std::vector<at::Tensor> host = host_grads(), device = on(host_grads(), cuda);
    const double expected = clip_gradients(host, max_norm);
    const at::Tensor queued = clip_gradients_queued(device, max_norm);
    EXPECT_TRUE(queued.is_cuda()) << "the norm was read back to the host";
    EXPECT_NEAR(queued.item<double>(), expected, 1e-6 * expected) << "max_norm " << max_norm;
    for (size_t i = 0; i < host.size(); ++i)
      EXPECT_TRUE(at::allclose(device[i].cpu(), host[i], 1e-6, 1e-7)) << "gradient " << i << ", max_norm " << max_norm;
  }
}

TEST(GpuClipping, NonfiniteNormLeavesTheGradientsAsTheyWere) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const c10::Device cuda(c10::kCUDA, 0);
  for (const float bad : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    std::vector<at::Tensor> grads = host_grads();
    grads[1][3] = bad;
    std::vector<at::Tensor> device = on(grads, cuda);
    const double got = clip_gradients_queued(device, 1.0).item<double>();
    EXPECT_FALSE(std::isfinite(got));
    EXPECT_TRUE(at::equal(device[0].cpu(), grads[0]));
    EXPECT_TRUE(at::equal(device[2].cpu(), grads[2]));
  }
}

}  // namespace
}  // namespace tessera
