// The fused layer norm's autograd function (model/fused_layer_norm.h) on the CPU, where it runs
// its formulas from ATen ops (the GPU test holds the kernels to the same): against the composite
// it replaces (x + branch, at::layer_norm in float32, the cast to bf16), the outputs and every
// gradient (x, branch, weight, bias), with and without a branch and a bias, and with the sum's
// own gradient or without it.
#include <gtest/gtest.h>

#include <torch/types.h>
#include <torch/utils.h>

#include "model/fused_layer_norm.h"
#include "model/norm.h"

namespace tessera {
namespace {

struct Result {
  at::Tensor sum, normed, dx, dbranch, dw, db;
};

// fused or composite; with_branch: x + branch is normalised; use_sum: the loss also reads the sum
Result run(bool fused, bool with_branch, bool with_bias, bool use_sum) {
  torch::manual_seed(11);
  const int64_t C = 40;
  at::Tensor x = (torch::randn({3, 7, C}) * 2 + 0.5).requires_grad_(true);
  at::Tensor branch = torch::randn({3, 7, C}).to(at::kBFloat16).requires_grad_(true);
  at::Tensor w = (torch::randn({C}) * 0.3 + 1).requires_grad_(true);
  at::Tensor b = with_bias ? (torch::randn({C}) * 0.1).requires_grad_(true) : at::Tensor();
  const at::Tensor r_normed = torch::randn({3, 7, C}), r_sum = torch::randn({3, 7, C});
  at::Tensor sum, normed;
  if (fused && with_branch) {
    auto out = add_layer_norm_bf16(x, branch, w, b, kNormEps);
    sum = out.sum;
    normed = out.normed;
  } else if (fused) {
    normed = layer_norm_bf16(x, w, b, kNormEps);
  } else {
    sum = with_branch ? x + branch : x;
    normed = at::layer_norm(sum, {C}, w, b, kNormEps).to(at::kBFloat16);
  }
  at::Tensor loss = (normed.to(at::kFloat) * r_normed).sum();
  if (with_branch && use_sum) loss = loss + (sum * r_sum).sum();
  loss.backward();
  return {with_branch ? sum.detach() : at::Tensor(), normed.detach(), x.grad(),
          with_branch ? branch.grad() : at::Tensor(), w.grad(), with_bias ? b.grad() : at::Tensor()};
}

void expect_close(const at::Tensor& got, const at::Tensor& want, double tol, const std::string& what) {
  ASSERT_TRUE(got.defined()) << what;
  ASSERT_TRUE(want.defined()) << what;
  EXPECT_EQ(got.scalar_type(), want.scalar_type()) << what;
  EXPECT_EQ(got.sizes(), want.sizes()) << what;
  EXPECT_TRUE(at::allclose(got.to(at::kFloat), want.to(at::kFloat), tol, tol))
      << what << ": largest difference " << (got.to(at::kFloat) - want.to(at::kFloat)).abs().max().item<double>();
}

TEST(FusedLayerNorm, MatchesTheCompositeItReplacesWithEveryGradient) {
  for (const bool with_branch : {true, false}) {
    for (const bool with_bias : {true, false}) {
      for (const bool use_sum : {true, false}) {
        if (!with_branch && use_sum) continue;
        const std::string what = std::string("branch ") + (with_branch ? "yes" : "no") + ", bias " +
                                 (with_bias ? "yes" : "no") + ", sum read " + (use_sum ? "yes" : "no") + ": ";
        const Result fused = run(true, with_branch, with_bias, use_sum), composite = run(false, with_branch, with_bias, use_sum);
        EXPECT_EQ(fused.normed.scalar_type(), at::kBFloat16) << what;
        // one bf16 rounding of float32 values that agree to float32 rounding
        expect_close(fused.normed, composite.normed, 1e-2, what + "normed");
        expect_close(fused.dx, composite.dx, 1e-4, what + "x's gradient");
        expect_close(fused.dw, composite.dw, 1e-4, what + "weight's gradient");
        if (with_bias) expect_close(fused.db, composite.db, 1e-4, what + "bias's gradient");
        if (with_branch) {
          EXPECT_TRUE(at::equal(fused.sum, composite.sum)) << what << "sum";
          expect_close(fused.dbranch, composite.dbranch, 1e-2, what + "branch's gradient");
        }
      }
    }
  }
}

// The norm's own entry points fall back to the composite off the GPU: what a CPU run computes is
// unchanged.
TEST(FusedLayerNorm, NormForMatmulIsTheCompositeOffTheGpu) {
  torch::manual_seed(2);
  Norm norm(NormKind::layer, 16, true, at::TensorOptions());
  norm->named_parameters()["weight"].data().normal_(1, 0.1);
  norm->named_parameters()["bias"].data().normal_(0, 0.1);
  const at::Tensor x = torch::randn({4, 16}), branch = torch::randn({4, 16});
  EXPECT_FALSE(fused_layer_norm_applies(x, norm->named_parameters()["weight"]));
  EXPECT_TRUE(at::equal(norm->for_matmul(x), norm(x)));
  const NormedSum out = norm->add_for_matmul(x, branch);
  EXPECT_TRUE(at::equal(out.sum, x + branch));
  EXPECT_TRUE(at::equal(out.normed, norm(x + branch)));
}

}  // namespace
}  // namespace tessera
