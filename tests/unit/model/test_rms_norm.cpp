// RMSNorm's fused CPU function (model/rms_norm.h) against ATen's: the output and both gradients
// checked against float64 (ATen's composite in double), on tiny_llama's shape, on Qwen 3's q norm
// (a view of the joined projection, rows not evenly strided), without a weight, and at a width and
// a row count the kernels' lanes and blocks do not divide; the same bits with one thread and two;
// and what the function is for: faster than ATen's.
#include <gtest/gtest.h>

#include <ATen/Parallel.h>

#include <array>
#include <cstdio>

#include <torch/types.h>
#include <torch/utils.h>

#include "model/rms_norm.h"
#include "test_util.h"

namespace tessera {
namespace {

struct Outcome {
  at::Tensor y, dx, dw;
};

using View = at::Tensor (*)(const at::Tensor&);
at::Tensor whole(const at::Tensor& t) { return t; }

// The norm of view(base) and its gradients (dx: base's gradient).
Outcome run(const at::Tensor& base, View view, const at::Tensor& w, const at::Tensor& dy, bool fused) {
  const at::Tensor leaf = base.detach().clone().requires_grad_(true);
  const at::Tensor ws = w.defined() ? w.detach().clone().requires_grad_(true) : at::Tensor();
  const at::Tensor y = fused ? rms_norm(view(leaf), ws, 1e-5) : rms_norm_aten(view(leaf), ws, 1e-5);
  y.backward(dy.to(y.scalar_type()));
  return {y.detach(), leaf.grad(), ws.defined() ? ws.grad() : at::Tensor()};
}

// The largest error against the float64 result, over the largest magnitude of that result.
double error(const at::Tensor& got, const at::Tensor& exact) {
  return (got.to(at::kDouble) - exact).abs().max().item<double>() / exact.abs().max().item<double>();
}

void expect_as_accurate_as_aten(const char* what, const at::Tensor& base, View view, const at::Tensor& w) {
  const at::Tensor dy = torch::randn(view(base).sizes());
  const Outcome fused = run(base, view, w, dy, true), aten = run(base, view, w, dy, false);
  const Outcome exact = run(base.to(at::kDouble), view, w.defined() ? w.to(at::kDouble) : at::Tensor(), dy, false);
  const std::pair<const char*, std::array<at::Tensor, 3>> parts[] = {{"y", {fused.y, aten.y, exact.y}},
                                                                     {"dx", {fused.dx, aten.dx, exact.dx}},
                                                                     {"dw", {fused.dw, aten.dw, exact.dw}}};
  for (const auto& [name, t] : parts) {
    if (!t[0].defined()) continue;
    const double ours = error(t[0], t[2]), theirs = error(t[1], t[2]);
    std::printf("%s %s: fused %.2e, ATen %.2e of the largest magnitude\n", what, name, ours, theirs);
    EXPECT_LT(ours, 1e-6) << what << " " << name;
    EXPECT_LE(ours, 4 * theirs + 1e-7) << what << " " << name;
  }
  // Evaluation runs the same forward.
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(torch::equal(rms_norm(view(base), w, 1e-5), fused.y)) << what;
}

TEST(RmsNorm, TheFusedFunctionIsAsAccurateAsTheComposite) {
  torch::manual_seed(5);
  const at::Tensor weight = 1 + 0.1 * torch::randn({128});
  expect_as_accurate_as_aten("tiny_llama [16, 128, 128]", 3 * torch::randn({16, 128, 128}), whole, weight);
  // Qwen 3's q norm: q a view [B, T, h, d] of the joined projection [B, T, (h + 2 kv) d].
  const View q = [](const at::Tensor& qkv) { return qkv.narrow(-1, 0, 4 * 32).view({2, 24, 4, 32}); };
  const at::Tensor qkv = torch::randn({2, 24, (4 + 2 * 2) * 32});
  ASSERT_FALSE(q(qkv).is_contiguous());
  expect_as_accurate_as_aten("q [2, 24, 4, 32] in its projection", qkv, q, 1 + 0.1 * torch::randn({32}));
  expect_as_accurate_as_aten("no weight [5, 7, 64]", torch::randn({5, 7, 64}), whole, at::Tensor());
  expect_as_accurate_as_aten("width 37, 100 rows", torch::randn({100, 37}), whole, torch::randn({37}));
}

TEST(RmsNorm, TheSameBitsWithAnyNumberOfThreads) {
  torch::manual_seed(6);
  const at::Tensor x = torch::randn({8, 200, 96}), w = torch::randn({96}), dy = torch::randn({8, 200, 96});
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  const Outcome one = run(x, whole, w, dy, true);
  at::set_num_threads(std::max(2, threads));
  const Outcome more = run(x, whole, w, dy, true);
  at::set_num_threads(threads);
  EXPECT_TRUE(torch::equal(one.y, more.y));
  EXPECT_TRUE(torch::equal(one.dx, more.dx));
  EXPECT_TRUE(torch::equal(one.dw, more.dw));
}

TEST(RmsNorm, TheFusedFunctionIsFasterThanAtens) {
  torch::manual_seed(7);
  const at::Tensor x = torch::randn({16, 128, 128}).requires_grad_(true), w = torch::ones({128}).requires_grad_(true);
  const at::Tensor dy = torch::randn({16, 128, 128});
  const auto pass = [&](auto&& norm) {
    return [&x, &w, &dy, norm] {
      x.mutable_grad() = at::Tensor();
      w.mutable_grad() = at::Tensor();
      norm(x, w, 1e-5).backward(dy);
    };
  };
  const std::vector<double> ms = test::best_ms_each({pass(rms_norm), pass(rms_norm_aten)});
  const double fused = ms[0], aten = ms[1];
  std::printf("RMSNorm forward + backward at tiny_llama's [16, 128, 128]: fused %.3f ms, ATen %.3f ms\n", fused, aten);
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)  // our loops are instrumented there, ATen's not
  EXPECT_LT(fused, aten);
#endif
}

}  // namespace
}  // namespace tessera
