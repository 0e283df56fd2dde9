// clip_grad_norm against a norm computed by hand in float64, with and without clipping, and with
// nonfinite gradients.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include <torch/types.h>
#include <torch/utils.h>

#include "optim/clipping.h"
#include "test_util.h"

namespace tessera {
namespace {

std::vector<at::Tensor> params_with_grads() {
  std::vector<at::Tensor> params;
  for (auto shape : {std::vector<int64_t>{5, 7}, {7}, {3, 2, 4}}) {
    auto p = torch::randn(shape).requires_grad_(true);
    p.mutable_grad() = torch::randn(shape) * 3;
    params.push_back(p);
  }
  params.push_back(torch::randn({4}).requires_grad_(true));  // no grad: ignored
  return params;
}

double manual_norm(const std::vector<at::Tensor>& params) {
  double sum = 0;
  for (const auto& p : params)
    if (p.grad().defined()) sum += p.grad().to(at::kDouble).pow(2).sum().item<double>();
  return std::sqrt(sum);
}

TEST(ClipGradNorm, MeasuresWithoutClippingWhenOff) {
  auto params = params_with_grads();
  auto before = params[0].grad().clone();
  const double expected = manual_norm(params);
  EXPECT_NEAR(clip_grad_norm(params, 0.0), expected, 1e-6 * expected);
  EXPECT_TRUE(at::equal(params[0].grad(), before));
  EXPECT_NEAR(clip_grad_norm(params, 2 * expected), expected, 1e-6 * expected);
  EXPECT_TRUE(at::equal(params[0].grad(), before));
}

TEST(ClipGradNorm, ScalesToMaxNorm) {
  auto params = params_with_grads();
  const double expected = manual_norm(params);
  std::vector<at::Tensor> before;
  for (const auto& p : params) before.push_back(p.grad().defined() ? p.grad().clone() : at::Tensor());
  const double max_norm = expected / 4;
  EXPECT_NEAR(clip_grad_norm(params, max_norm), expected, 1e-6 * expected);  // norm before clipping
  EXPECT_NEAR(manual_norm(params), max_norm, 1e-5 * max_norm);
  for (size_t i = 0; i < 3; ++i)
    EXPECT_TRUE(test::all_close(params[i].grad(), before[i] * (max_norm / (expected + 1e-6)), 1e-6, 1e-7));
}

TEST(ClipGradNorm, NonfiniteNormIsReturnedAndGradsKept) {
  auto params = params_with_grads();
  params[1].grad()[3] = std::numeric_limits<float>::infinity();
  auto before = params[0].grad().clone();
  EXPECT_TRUE(std::isinf(clip_grad_norm(params, 1.0)));
  EXPECT_TRUE(at::equal(params[0].grad(), before));
  params[1].grad()[3] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(clip_grad_norm(params, 1.0)));
  EXPECT_TRUE(at::equal(params[0].grad(), before));
}

TEST(ClipGradNorm, QueuedKeepsTheNormATensorAndClipsAlike) {
  for (const double fraction : {0.0, 2.0, 0.25}) {
    auto params = params_with_grads(), twins = params_with_grads();
    for (size_t i = 0; i < 3; ++i) twins[i].mutable_grad() = params[i].grad().clone();
    std::vector<at::Tensor> grads;
    for (size_t i = 0; i < 3; ++i) grads.push_back(twins[i].grad());
    const double max_norm = fraction * manual_norm(params);
    const double expected = clip_grad_norm(params, max_norm);
    const at::Tensor queued = clip_gradients_queued(grads, max_norm);
    ASSERT_EQ(queued.dim(), 0);
    EXPECT_EQ(queued.item<double>(), expected);
    for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(at::equal(twins[i].grad(), params[i].grad())) << "max_norm " << max_norm;
  }
  EXPECT_FALSE(clip_gradients_queued({}, 1.0).defined());
}

TEST(ClipGradNorm, NoGradsIsZero) {
  std::vector<at::Tensor> params{torch::randn({3}).requires_grad_(true)};
  EXPECT_EQ(clip_grad_norm(params, 1.0), 0.0);
}

}  // namespace
}  // namespace tessera
