// Rotary position embedding's fused CPU function (model/rotary.h) against ATen's composite of the
// same formula: bit for bit forward and backward, on q and k as attention makes them (a transposed
// view of the projection, non-contiguous), with offset positions and Llama 3's scaled frequencies;
// other inputs take the composite. And what the fused function is for: faster on this machine.
#include <gtest/gtest.h>

#include <cstdio>

#include <torch/types.h>
#include <torch/utils.h>

#include "model/model_options.h"
#include "model/rotary.h"
#include "test_util.h"

namespace tessera {
namespace {

// [B, h, T, d] as attention.cpp makes q: a view of [B, T, h, d] transposed.
at::Tensor heads_view(int64_t B, int64_t h, int64_t T, int64_t d) {
  return torch::randn({B, T, h * d}).view({B, T, h, d}).transpose(1, 2).detach().requires_grad_(true);
}

void expect_same_as_composite(const at::Tensor& x, const RotaryTables& tables) {
  const at::Tensor x2 = x.detach().clone().requires_grad_(true);
  const at::Tensor y = apply_rotary(x, tables), y2 = apply_rotary_composite(x2, tables);
  EXPECT_TRUE(torch::equal(y, y2));
  const at::Tensor g = torch::randn(y.sizes());
  y.backward(g);
  y2.backward(g);
  EXPECT_TRUE(torch::equal(x.grad(), x2.grad()));
  EXPECT_GT(x.grad().abs().sum().item<double>(), 0);
}

TEST(Rotary, TheFusedFunctionEqualsTheCompositeBitForBit) {
  torch::manual_seed(3);
  const ModelOptions o = ModelOptions::from_preset("tiny_llama");
  const at::Tensor inv = rotary_inverse_frequencies(o);
  for (const int64_t offset : {int64_t{0}, int64_t{96}}) {
    const RotaryTables tables = rotary_tables(inv, offset, 24, at::TensorOptions().dtype(at::kFloat));
    expect_same_as_composite(heads_view(3, 4, 24, o.head_width()), tables);
    expect_same_as_composite(torch::randn({2, 2, 24, o.head_width()}).requires_grad_(true), tables);
  }
  const ModelOptions scaled = ModelOptions::from_preset("llama3_8b");
  const RotaryTables long_tables = rotary_tables(rotary_inverse_frequencies(scaled), 8000, 16, at::TensorOptions());
  expect_same_as_composite(heads_view(1, 2, 16, scaled.head_width()), long_tables);
  // bf16 takes the composite (it rounds each product to bf16): the same function, so the same values.
  const RotaryTables bf16 = rotary_tables(inv, 0, 24, at::TensorOptions().dtype(at::kBFloat16));
  const at::Tensor xb = torch::randn({2, 4, 24, o.head_width()}).to(at::kBFloat16);
  EXPECT_TRUE(torch::equal(apply_rotary(xb, bf16), apply_rotary_composite(xb, bf16)));
}

TEST(Rotary, TheFusedFunctionIsFasterThanTheComposite) {
  torch::manual_seed(4);
  const RotaryTables tables =
      rotary_tables(rotary_inverse_frequencies(ModelOptions::from_preset("tiny_llama")), 0, 128, at::TensorOptions());
  const at::Tensor x = heads_view(16, 4, 128, 32);
  const at::Tensor g = torch::randn({16, 4, 128, 32});
  const auto pass = [&](auto&& rotate) {
    return [&x, &g, &tables, rotate] {
      x.mutable_grad() = at::Tensor();
      rotate(x, tables).backward(g);
    };
  };
  const std::vector<double> ms = test::best_ms_each({pass(apply_rotary), pass(apply_rotary_composite)});
  const double fused = ms[0], composite = ms[1];
  std::printf("rotary forward + backward, q of tiny_llama at batch 16: fused %.3f ms, composite %.3f ms\n", fused,
              composite);
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)  // our loop is instrumented there, ATen's not
  EXPECT_LT(fused, composite);
#endif
}

}  // namespace
}  // namespace tessera
