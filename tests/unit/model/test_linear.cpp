// linear_fp32_weight_grads (model/linear.h) against at::linear under bf16 autocast, on the CPU:
// the same bf16 output, float32 gradients of the same values (the CPU's weight gradient is the
// bf16 GEMM widened, so they agree to bf16 rounding), with and without a bias, and only the
// gradients that are needed.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "model/linear.h"
#include "precision/autocast.h"

namespace tessera {
namespace {

struct Grads {
  at::Tensor y, x, w, b;
};

Grads run(bool fused, bool with_bias, bool x_needs_grad) {
  torch::manual_seed(3);
  at::Tensor x = torch::randn({2, 5, 8}).requires_grad_(x_needs_grad);
  at::Tensor w = torch::randn({6, 8}).requires_grad_(true);
  at::Tensor b = with_bias ? torch::randn({6}).requires_grad_(true) : at::Tensor();
  at::Tensor r = torch::randn({2, 5, 6});
  at::Tensor y;
  {
    AutocastGuard guard(at::kCPU, at::kBFloat16);
    y = fused ? linear_fp32_weight_grads(x, w, b) : at::linear(x, w, b);
  }
  (y.to(at::kFloat) * r).sum().backward();
  return {y.detach(), x.grad(), w.grad(), with_bias ? b.grad() : at::Tensor()};
}

void expect_close(const at::Tensor& got, const at::Tensor& want, const char* what) {
  ASSERT_TRUE(got.defined()) << what;
  EXPECT_EQ(got.scalar_type(), at::kFloat) << what;
  EXPECT_EQ(got.sizes(), want.sizes()) << what;
  EXPECT_TRUE(at::allclose(got, want.to(at::kFloat), 2e-2, 2e-2)) << what << ": largest difference "
                                                                   << (got - want).abs().max().item<double>();
}

TEST(LinearFp32WeightGrads, MatchesAutocastLinearWithAndWithoutBias) {
  for (const bool with_bias : {true, false}) {
    const Grads fused = run(true, with_bias, true), reference = run(false, with_bias, true);
    EXPECT_EQ(fused.y.scalar_type(), at::kBFloat16);
    EXPECT_TRUE(at::equal(fused.y, reference.y)) << "the forward is at::linear's in bf16";
    expect_close(fused.x, reference.x, "input gradient");
    expect_close(fused.w, reference.w, "weight gradient");
    if (with_bias) expect_close(fused.b, reference.b, "bias gradient");
  }
}

TEST(LinearFp32WeightGrads, ComputesOnlyTheGradientsNeeded) {
  const Grads fused = run(true, true, false), reference = run(false, true, false);
  EXPECT_FALSE(fused.x.defined());
  expect_close(fused.w, reference.w, "weight gradient");
  expect_close(fused.b, reference.b, "bias gradient");
}

}  // namespace
}  // namespace tessera
