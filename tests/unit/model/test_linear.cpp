// linear_fp32_weight_grads (model/linear.h) against at::linear under bf16 autocast, on the CPU:
// the same bf16 output, float32 gradients of the same values (the CPU's weight gradient is the
// bf16 GEMM widened, so they agree to bf16 rounding), with and without a bias, and only the
// gradients that are needed.
#include <gtest/gtest.h>

#include <torch/types.h>
#include <torch/utils.h>

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
    y = !fused ? at::linear(x, w, b) : with_bias ? linear_fp32_weight_grads(x, {w}, {b}) : linear_fp32_weight_grads(x, {w}, {});
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

// Two weights joined (the query and key/value projections' one GEMM): each weight's and bias's
// gradient is its rows of the joined product's, the output the product of the concatenation.
TEST(LinearFp32WeightGrads, JoinedWeightsGetTheirRowsOfTheGradient) {
  torch::manual_seed(4);
  const at::Tensor x = torch::randn({2, 5, 8});
  const at::Tensor w1 = torch::randn({6, 8}).requires_grad_(true), w2 = torch::randn({4, 8}).requires_grad_(true);
  const at::Tensor b1 = torch::randn({6}).requires_grad_(true), b2 = torch::randn({4}).requires_grad_(true);
  const at::Tensor w = at::cat({w1, w2}).detach().requires_grad_(true), b = at::cat({b1, b2}).detach().requires_grad_(true);
  const at::Tensor r = torch::randn({2, 5, 10});
  at::Tensor joined, whole;
  {
    AutocastGuard guard(at::kCPU, at::kBFloat16);
    joined = linear_fp32_weight_grads(x, {w1, w2}, {b1, b2});
    whole = linear_fp32_weight_grads(x, {w}, {b});
  }
  EXPECT_TRUE(at::equal(joined, whole));
  (joined.to(at::kFloat) * r).sum().backward();
  (whole.to(at::kFloat) * r).sum().backward();
  EXPECT_TRUE(at::equal(at::cat({w1.grad(), w2.grad()}), w.grad()));
  EXPECT_TRUE(at::equal(at::cat({b1.grad(), b2.grad()}), b.grad()));
}

TEST(LinearFp32WeightGrads, ComputesOnlyTheGradientsNeeded) {
  const Grads fused = run(true, true, false), reference = run(false, true, false);
  EXPECT_FALSE(fused.x.defined());
  expect_close(fused.w, reference.w, "weight gradient");
  expect_close(fused.b, reference.b, "bias gradient");
}

}  // namespace
}  // namespace tessera
