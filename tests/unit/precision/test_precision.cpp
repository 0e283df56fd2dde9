// [precision] checks, the autocast dtype policy, AutocastGuard nesting and restore, WeightCastCache's
// copies (shared while kept, cast again after an in-place change, none without history where grad
// mode records), and the
// dynamic loss scale's growth/backoff (fp16.h) against at::_amp_update_scale_'s rules.
#include <gtest/gtest.h>

#include <ATen/autocast_mode.h>
#include <torch/nn/modules/linear.h>
#include <torch/types.h>
#include <torch/utils.h>

#include "core/error.h"
#include "precision/autocast.h"
#include "precision/fp16.h"
#include "precision/precision_options.h"

namespace tessera {
namespace {

TEST(PrecisionOptions, CheckNamesTheKey) {
  PrecisionOptions ok;
  EXPECT_NO_THROW(ok.check("run.toml"));
  auto expect_error = [](PrecisionOptions o, const std::string& needle) {
    try {
      o.check("run.toml");
      FAIL() << "expected " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("run.toml: precision." + needle), std::string::npos) << e.what();
    }
  };
  PrecisionOptions o;
  o.dtype = "fp8";
  expect_error(o, "dtype must be fp32, bf16 or fp16 (got fp8)");
  o = {};
  o.loss_scale_init = 0;
  expect_error(o, "loss_scale_init");
  o = {};
  o.loss_scale_backoff = 1.0;
  expect_error(o, "loss_scale_backoff");
  o = {};
  o.loss_scale_growth_interval = 0;
  expect_error(o, "loss_scale_growth_interval");
}

TEST(PrecisionOptions, AutocastOnlyForBf16) {
  PrecisionOptions o;
  EXPECT_FALSE(autocast_dtype(o).has_value());
  EXPECT_EQ(parameter_dtype(o), at::kFloat);
  o.dtype = "bf16";
  EXPECT_EQ(autocast_dtype(o), std::optional<at::ScalarType>(at::kBFloat16));
  EXPECT_EQ(parameter_dtype(o), at::kFloat);
  o.dtype = "fp16";
  EXPECT_FALSE(autocast_dtype(o).has_value());
  EXPECT_EQ(parameter_dtype(o), at::kHalf);
}

TEST(AutocastGuard, NestsAndRestores) {
  namespace ac = at::autocast;
  const bool enabled0 = ac::is_autocast_enabled(at::kCPU);
  const at::ScalarType dtype0 = ac::get_autocast_dtype(at::kCPU);
  ASSERT_FALSE(enabled0);
  torch::nn::Linear linear(8, 4);
  auto x = torch::randn({2, 8});
  {
    AutocastGuard outer(at::kCPU, at::kBFloat16, true);
    EXPECT_TRUE(ac::is_autocast_enabled(at::kCPU));
    EXPECT_EQ(ac::get_autocast_dtype(at::kCPU), at::kBFloat16);
    EXPECT_EQ(linear(x).scalar_type(), at::kBFloat16);
    {
      AutocastGuard inner(at::kCPU, at::kHalf, false);
      EXPECT_FALSE(ac::is_autocast_enabled(at::kCPU));
      EXPECT_EQ(ac::get_autocast_dtype(at::kCPU), at::kHalf);
      EXPECT_EQ(linear(x).scalar_type(), at::kFloat);
    }
    EXPECT_TRUE(ac::is_autocast_enabled(at::kCPU));
    EXPECT_EQ(ac::get_autocast_dtype(at::kCPU), at::kBFloat16);
    EXPECT_EQ(linear(x).scalar_type(), at::kBFloat16);
  }
  EXPECT_EQ(ac::is_autocast_enabled(at::kCPU), enabled0);
  EXPECT_EQ(ac::get_autocast_dtype(at::kCPU), dtype0);
  EXPECT_EQ(linear(x).scalar_type(), at::kFloat);
}

TEST(AutocastGuard, Bf16ForwardMatchesExplicitCasts) {
  torch::nn::Linear linear(16, 8);
  auto x = torch::randn({4, 16});
  at::Tensor y;
  {
    AutocastGuard guard(at::kCPU, at::kBFloat16, true);
    y = linear(x);
  }
  auto expected = at::linear(x.to(at::kBFloat16), linear->weight.to(at::kBFloat16), linear->bias.to(at::kBFloat16));
  EXPECT_TRUE(at::equal(y, expected));
}

TEST(WeightCastCache, SharesACopyWhileKeptAndCastsAgainWhenTheWeightChanges) {
  auto w = torch::randn({8, 8}).requires_grad_();
  // Without a cache every call casts.
  EXPECT_NE(cast_weight(w, at::kBFloat16).data_ptr(), cast_weight(w, at::kBFloat16).data_ptr());
  WeightCastCache cache;
  const at::Tensor first = cast_weight(w, at::kBFloat16);
  EXPECT_EQ(first.scalar_type(), at::kBFloat16);
  EXPECT_EQ(cast_weight(w, at::kBFloat16).data_ptr(), first.data_ptr());
  // The copy carries the weight's gradient.
  (cast_weight(w, at::kBFloat16).to(at::kFloat) * 3).sum().backward();
  EXPECT_TRUE(at::equal(w.grad(), at::full({8, 8}, 3.0)));
  {
    torch::NoGradGuard no_grad;
    w.add_(1.0);  // the optimizer's step
  }
  const at::Tensor after = cast_weight(w, at::kBFloat16);
  EXPECT_NE(after.data_ptr(), first.data_ptr());
  EXPECT_TRUE(at::equal(after, w.detach().to(at::kBFloat16)));
}

TEST(WeightCastCache, ACopyCastUnderNoGradIsNotHandedToARecordedProduct) {
  auto w = torch::randn({8, 8}).requires_grad_();
  WeightCastCache cache;
  at::Tensor plain;
  {
    torch::NoGradGuard no_grad;  // a checkpointed segment's forward
    plain = cast_weight(w, at::kBFloat16);
    EXPECT_EQ(cast_weight(w, at::kBFloat16).data_ptr(), plain.data_ptr());
  }
  const at::Tensor recorded = cast_weight(w, at::kBFloat16);  // its recomputation
  EXPECT_TRUE(recorded.requires_grad());
  recorded.to(at::kFloat).sum().backward();
  ASSERT_TRUE(w.grad().defined());
  EXPECT_TRUE(at::equal(w.grad(), at::ones({8, 8})));
}

// The micro-batches share the copy, not its autograd node: the second micro-batch's weight
// gradient reaches the weight before the gradient of an input computed earlier in its forward.
// With one node shared by both (numbered in the first micro-batch's forward) the engine ran it
// after every node of the second, and the weight's gradient arrived at the backward's end.
TEST(WeightCastCache, EachMicroBatchsWeightGradientArrivesWithItsProductsBackward) {
  auto w = torch::randn({4, 4}).requires_grad_();
  WeightCastCache cache;
  auto x1 = torch::randn({2, 4}).requires_grad_();
  const at::Tensor shared = cast_weight(w, at::kBFloat16);
  const at::Tensor first = x1.matmul(shared.to(at::kFloat)).sum();
  auto x2 = torch::randn({2, 4}).requires_grad_();
  const at::Tensor h = x2 * 2;
  const at::Tensor copy = cast_weight(w, at::kBFloat16);
  EXPECT_EQ(copy.data_ptr(), shared.data_ptr());
  const at::Tensor second = h.matmul(copy.to(at::kFloat)).sum();
  bool weight_first = false;
  x2.register_hook([&](const at::Tensor& g) {
    weight_first = w.grad().defined();
    return g;
  });
  second.backward();
  EXPECT_TRUE(weight_first);
  first.backward();
  // The gradients pass through bf16, as any cast's do.
  EXPECT_TRUE(at::allclose(w.grad(), (x1.sum(0) + 2 * x2.sum(0)).unsqueeze(1).expand({4, 4}), 1e-2, 1e-2));
}

// Weights joined into one operand (cast_joined): one copy of the join while kept, its gradient
// split into the weights' rows as a concatenation's, and cast again when one of them changes.
TEST(WeightCastCache, AJoinOfWeightsIsOneCopyWhoseGradientSplitsIntoTheirRows) {
  auto q = torch::randn({6, 4}).requires_grad_(), kv = torch::randn({2, 4}).requires_grad_();
  WeightCastCache cache;
  const at::Tensor first = cast_joined({q, kv}, at::kBFloat16);
  EXPECT_EQ(first.sizes(), (std::vector<int64_t>{8, 4}));
  EXPECT_TRUE(at::equal(first, at::cat({q, kv}).detach().to(at::kBFloat16)));
  const at::Tensor second = cast_joined({q, kv}, at::kBFloat16);
  EXPECT_EQ(second.data_ptr(), first.data_ptr());
  const at::Tensor r = torch::randn({8, 4});
  (first.to(at::kFloat) * r).sum().backward();
  (second.to(at::kFloat) * r).sum().backward();
  const at::Tensor expected = 2 * r.to(at::kBFloat16).to(at::kFloat);
  EXPECT_TRUE(at::equal(q.grad(), expected.narrow(0, 0, 6)));
  EXPECT_TRUE(at::equal(kv.grad(), expected.narrow(0, 6, 2)));
  {
    torch::NoGradGuard no_grad;
    kv.add_(1.0);
  }
  EXPECT_NE(cast_joined({q, kv}, at::kBFloat16).data_ptr(), first.data_ptr());
  // Without a cast (float32) the join is the concatenation, with its gradient.
  EXPECT_EQ(cast_joined({q, kv}, at::kFloat).scalar_type(), at::kFloat);
}

PrecisionOptions scaler_options() {
  PrecisionOptions o;
  o.dtype = "fp16";
  o.loss_scale_init = 1024;
  o.loss_scale_growth_interval = 3;
  return o;
}

TEST(DynamicLossScaler, GrowsAfterIntervalAndBacksOffOnInf) {
  DynamicLossScaler scaler(scaler_options());
  EXPECT_EQ(scaler.value(), 1024);
  scaler.update(false);
  scaler.update(false);
  EXPECT_EQ(scaler.value(), 1024);
  EXPECT_EQ(scaler.good_steps(), 2);
  scaler.update(false);
  EXPECT_EQ(scaler.value(), 2048);
  EXPECT_EQ(scaler.good_steps(), 0);
  scaler.update(false);
  scaler.update(true);
  EXPECT_EQ(scaler.value(), 1024);
  EXPECT_EQ(scaler.good_steps(), 0);
  scaler.update(true);
  EXPECT_EQ(scaler.value(), 512);
  EXPECT_EQ(scaler.scale().scalar_type(), at::kFloat);
  EXPECT_EQ(scaler.scale().item<double>(), 512);
}

TEST(DynamicLossScaler, StateRoundTrip) {
  DynamicLossScaler a(scaler_options());
  a.update(true);
  a.update(false);
  std::map<std::string, at::Tensor> saved;
  for (const auto& [n, t] : a.state()) saved[n] = t.clone();
  DynamicLossScaler b(scaler_options());
  b.load_state(saved, "ckpt/optimizer.safetensors");
  EXPECT_EQ(b.value(), 512);
  EXPECT_EQ(b.good_steps(), 1);
  a.update(false);
  a.update(false);
  b.update(false);
  b.update(false);
  EXPECT_EQ(b.value(), a.value());
  EXPECT_EQ(b.value(), 1024);

  saved.erase("loss_scaler.growth_tracker");
  try {
    b.load_state(saved, "ckpt/optimizer.safetensors");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ckpt/optimizer.safetensors: loss scaler state loss_scaler.growth_tracker is missing"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace tessera
