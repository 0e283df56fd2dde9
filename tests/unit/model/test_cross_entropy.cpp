// cross_entropy_mean (model/cross_entropy.h): float32 logits go through at::cross_entropy_loss
// unchanged; bf16 logits give PyTorch autocast's values (log-softmax in bf16, then float32) without
// a float32 copy of the whole log-probability tensor; ignored targets (-1) leave the mean.
#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include "model/cross_entropy.h"
#include "test_util.h"

namespace tessera {
namespace {

struct Case {
  at::Tensor logits, targets;
};

Case random_case() {
  torch::manual_seed(5);
  Case c{torch::randn({12, 40}) * 3, torch::randint(40, {12}, torch::kLong)};
  c.targets[2] = -1;
  c.targets[7] = -1;
  return c;
}

TEST(CrossEntropy, Float32IsCrossEntropyLoss) {
  Case c = random_case();
  auto expected = at::cross_entropy_loss(c.logits, c.targets, {}, at::Reduction::Mean, -1);
  EXPECT_EQ(cross_entropy_mean(c.logits, c.targets).item<float>(), expected.item<float>());
}

TEST(CrossEntropy, Bf16IsAutocastsValueAndGradient) {
  Case c = random_case();
  auto ours_in = c.logits.to(at::kBFloat16).requires_grad_();
  auto theirs_in = c.logits.to(at::kBFloat16).requires_grad_();
  auto ours = cross_entropy_mean(ours_in, c.targets);
  // PyTorch's autocast on CUDA: log_softmax in bf16, nll_loss on its float32 copy.
  auto theirs = at::nll_loss(at::log_softmax(theirs_in, -1).to(at::kFloat), c.targets, {}, at::Reduction::Mean, -1);
  EXPECT_EQ(ours.scalar_type(), at::kFloat);
  EXPECT_NEAR(ours.item<float>(), theirs.item<float>(), 1e-6 * std::abs(theirs.item<float>()));
  ours.backward();
  theirs.backward();
  EXPECT_EQ(ours_in.grad().scalar_type(), at::kBFloat16);
  EXPECT_TRUE(test::all_close(ours_in.grad().to(at::kFloat), theirs_in.grad().to(at::kFloat), 1e-2, 1e-4));
  // The ignored rows get no gradient; the others sum to zero (softmax minus one-hot).
  EXPECT_EQ(ours_in.grad()[2].abs().sum().item<float>(), 0.0f);
  EXPECT_NEAR(ours_in.grad()[0].to(at::kFloat).sum().item<float>(), 0.0, 1e-3);
  // Against float32 throughout: within bf16's rounding of the logits' log-probabilities.
  auto exact = at::cross_entropy_loss(c.logits.to(at::kBFloat16).to(at::kFloat), c.targets, {}, at::Reduction::Mean, -1);
  EXPECT_NEAR(ours.item<float>(), exact.item<float>(), 2e-2);
}

}  // namespace
}  // namespace tessera
