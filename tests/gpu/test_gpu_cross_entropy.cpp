// cross_entropy_mean (model/cross_entropy.h) on a GPU with bf16 and fp16 logits runs the fused
// kernels: its loss and the logits' gradient against at::cross_entropy_loss on a float32 copy of
// the same logits (what PyTorch's autocast computes), with ignored targets, for a vocabulary that
// takes the 8-wide loads (a multiple of 8) and one that does not.
#include <gtest/gtest.h>

#include <torch/cuda.h>
#include <torch/types.h>
#include <torch/utils.h>

#include "model/cross_entropy.h"

namespace tessera {
namespace {

TEST(GpuCrossEntropy, FusedKernelsGiveTheFloat32LossAndGradient) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const auto cuda = at::TensorOptions().device(c10::Device(c10::kCUDA, 0));
  for (const at::ScalarType dtype : {at::kBFloat16, at::kHalf}) {
    for (const int64_t V : {50304, 1001}) {
      torch::manual_seed(9);
      const int64_t N = 37;
      at::Tensor targets = torch::randint(V, {N}, cuda.dtype(at::kLong));
      targets.index_put_({3}, -1);
      targets.index_put_({20}, -1);
      const at::Tensor logits = (torch::randn({N, V}, cuda) * 4).to(dtype);
      const at::Tensor ours_in = logits.clone().requires_grad_(true);
      const at::Tensor theirs_in = logits.to(at::kFloat).requires_grad_(true);
      const at::Tensor ours = cross_entropy_mean(ours_in, targets);
      const at::Tensor theirs = at::cross_entropy_loss(theirs_in, targets, {}, at::Reduction::Mean, -1);
      ours.backward();
      theirs.backward();
      const std::string what = std::string(dtype == at::kHalf ? "fp16" : "bf16") + ", V " + std::to_string(V) + ": ";
      EXPECT_EQ(ours.scalar_type(), at::kFloat) << what;
      EXPECT_NEAR(ours.item<double>(), theirs.item<double>(), 1e-4 * std::abs(theirs.item<double>())) << what;
      ASSERT_EQ(ours_in.grad().scalar_type(), dtype) << what;
      const at::Tensor g = ours_in.grad().to(at::kFloat), want = theirs_in.grad();
      EXPECT_TRUE(at::allclose(g, want, 1e-2, 1e-6))
          << what << "largest gradient difference " << (g - want).abs().max().item<double>();
      EXPECT_EQ(g[3].abs().sum().item<double>(), 0.0) << what << "an ignored row has a gradient";
    }
  }
}

}  // namespace
}  // namespace tessera
