// The fused layer norm's CUDA kernels (model/fused_layer_norm.h) against the same function on the
// CPU (its formulas from ATen ops, which the CPU test holds to at::layer_norm) and against the
// composite it replaces on the GPU: the outputs and every gradient, at widths that are and are not
// a multiple of a warp, with row counts that do not fill a block; the same gradients on a second
// run, bit for bit; and Norm choosing the kernels under bf16 autocast on the GPU.
#include <gtest/gtest.h>

#include <torch/cuda.h>
#include <torch/types.h>
#include <torch/utils.h>

#include "model/fused_layer_norm.h"
#include "model/norm.h"
#include "precision/autocast.h"

namespace tessera {
namespace {

struct Result {
  at::Tensor sum, normed, dx, dbranch, dw, db;
};

// The fused function on `device` (with a branch: add_layer_norm_bf16), or on the GPU the composite
Result run(const c10::Device& device, bool composite, bool with_branch, int64_t rows, int64_t C) {
  torch::manual_seed(17);
  const auto cpu = at::TensorOptions();
  // made on the CPU so that both devices see the same values
  at::Tensor x = (torch::randn({rows, C}, cpu) * 3 - 1).to(device).requires_grad_(true);
  at::Tensor branch = torch::randn({rows, C}, cpu).to(at::kBFloat16).to(device).requires_grad_(true);
  at::Tensor w = (torch::randn({C}, cpu) * 0.2 + 1).to(device).requires_grad_(true);
  at::Tensor b = (torch::randn({C}, cpu) * 0.1).to(device).requires_grad_(true);
  const at::Tensor r_normed = torch::randn({rows, C}, cpu).to(device), r_sum = torch::randn({rows, C}, cpu).to(device);
  at::Tensor sum, normed;
  if (composite) {
    sum = with_branch ? x + branch : x;
    normed = at::layer_norm(sum, {C}, w, b, kNormEps).to(at::kBFloat16);
  } else if (with_branch) {
    const NormedSum out = add_layer_norm_bf16(x, branch, w, b, kNormEps);
    sum = out.sum;
    normed = out.normed;
  } else {
    normed = layer_norm_bf16(x, w, b, kNormEps);
  }
  at::Tensor loss = (normed.to(at::kFloat) * r_normed).sum();
  if (with_branch) loss = loss + (sum * r_sum).sum();
  loss.backward();
  const auto home = [](const at::Tensor& t) { return t.defined() ? t.detach().cpu() : t; };
  return {with_branch ? home(sum) : at::Tensor(), home(normed), home(x.grad()),
          with_branch ? home(branch.grad()) : at::Tensor(), home(w.grad()), home(b.grad())};
}

void expect_close(const at::Tensor& got, const at::Tensor& want, double tol, const std::string& what) {
  ASSERT_TRUE(got.defined() && want.defined()) << what;
  EXPECT_EQ(got.scalar_type(), want.scalar_type()) << what;
  const at::Tensor g = got.to(at::kFloat), w = want.to(at::kFloat);
  EXPECT_TRUE(at::allclose(g, w, tol, tol)) << what << ": largest difference " << (g - w).abs().max().item<double>();
}

TEST(GpuFusedLayerNorm, KernelsMatchTheFormulasAndTheComposite) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const c10::Device cuda(c10::kCUDA, 0), cpu(c10::kCPU);
  for (const int64_t C : {40, 768, 1600}) {
    for (const bool with_branch : {true, false}) {
      const int64_t rows = 203;  // not a multiple of the 8 rows of a block
      const std::string what =
          "width " + std::to_string(C) + ", branch " + (with_branch ? "yes" : "no") + ": ";
      const Result kernel = run(cuda, false, with_branch, rows, C), formulas = run(cpu, false, with_branch, rows, C),
                composite = run(cuda, true, with_branch, rows, C);
      for (const Result* want : {&formulas, &composite}) {
        const std::string against = what + (want == &formulas ? "against the CPU formulas, " : "against the composite, ");
        expect_close(kernel.normed, want->normed, 1e-2, against + "normed");
        expect_close(kernel.dx, want->dx, 1e-3, against + "x's gradient");
        expect_close(kernel.dw, want->dw, 1e-3, against + "weight's gradient");
        expect_close(kernel.db, want->db, 1e-3, against + "bias's gradient");
        if (with_branch) {
          expect_close(kernel.sum, want->sum, 1e-6, against + "sum");
          expect_close(kernel.dbranch, want->dbranch, 1e-2, against + "branch's gradient");
        }
      }
      const Result again = run(cuda, false, with_branch, rows, C);
      EXPECT_TRUE(at::equal(again.dx, kernel.dx) && at::equal(again.dw, kernel.dw) && at::equal(again.db, kernel.db))
          << what << "a second run's gradients differ";
    }
  }
}

TEST(GpuFusedLayerNorm, NormChoosesTheKernelsUnderBf16Autocast) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const auto cuda = at::TensorOptions().device(c10::Device(c10::kCUDA, 0));
  Norm norm(NormKind::layer, 64, true, cuda);
  norm->named_parameters()["weight"].data().fill_(1);
  norm->named_parameters()["bias"].data().zero_();
  const at::Tensor x = torch::randn({5, 64}, cuda);
  EXPECT_EQ(norm->for_matmul(x).scalar_type(), at::kFloat);  // no autocast: the composite, float32
  AutocastGuard guard(at::kCUDA, at::kBFloat16);
  EXPECT_TRUE(fused_layer_norm_applies(x, norm->named_parameters()["weight"]));
  EXPECT_EQ(norm->for_matmul(x).scalar_type(), at::kBFloat16);
  EXPECT_EQ(norm->add_for_matmul(x, x.to(at::kBFloat16)).normed.scalar_type(), at::kBFloat16);
}

}  // namespace
}  // namespace tessera
