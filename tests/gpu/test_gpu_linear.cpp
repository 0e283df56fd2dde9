// linear() on a GPU under bf16 autocast (model/linear.h): the float32-weight-gradient function
// runs there, and its gradients are at::linear's, without their bf16 rounding.
#include <gtest/gtest.h>

#include <torch/cuda.h>
#include <torch/types.h>
#include <torch/utils.h>

#include "model/linear.h"
#include "precision/autocast.h"

namespace tessera {
namespace {

TEST(GpuLinear, Fp32WeightGradsMatchAutocastLinear) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const auto cuda = at::TensorOptions().device(c10::Device(c10::kCUDA, 0));
  for (const bool with_bias : {true, false}) {
    std::vector<at::Tensor> grads[2];
    at::Tensor outputs[2];
    for (int fused = 0; fused < 2; ++fused) {
      torch::manual_seed(5);
      at::Tensor x = torch::randn({4, 64, 96}, cuda).requires_grad_(true);
      at::Tensor w = (torch::randn({80, 96}, cuda) * 0.1).requires_grad_(true);
      at::Tensor b = with_bias ? torch::randn({80}, cuda).requires_grad_(true) : at::Tensor();
      at::Tensor r = torch::randn({4, 64, 80}, cuda);
      {
        AutocastGuard guard(at::kCUDA, at::kBFloat16);
        outputs[fused] = fused ? linear(x, w, b) : at::linear(x, w, b);
      }
      (outputs[fused].to(at::kFloat) * r).sum().backward();
      grads[fused] = {x.grad(), w.grad()};
      if (with_bias) grads[fused].push_back(b.grad());
    }
    EXPECT_TRUE(at::equal(outputs[0], outputs[1]));
    for (size_t i = 0; i < grads[0].size(); ++i) {
      EXPECT_EQ(grads[1][i].scalar_type(), at::kFloat);
      EXPECT_TRUE(at::allclose(grads[1][i], grads[0][i], 2e-2, 2e-2))
          << "gradient " << i << ", bias " << with_bias << ": largest difference "
          << (grads[1][i] - grads[0][i]).abs().max().item<double>();
    }
  }
}

}  // namespace
}  // namespace tessera
