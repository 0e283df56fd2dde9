// TrainStep's own fp16 path: an overflowing step is skipped by TrainStep::run itself (no
// parameter moves, the scale backs off, the result says so), and the next finite step updates.
#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include "train/train_step.h"

namespace tessera {
namespace {

Config tiny_fp16(double loss_scale) {
  Config c;
  c.model.n_layer = 1;
  c.model.n_head = 2;
  c.model.n_embd = 16;
  c.model.vocab_size = 32;
  c.model.block_size = 8;
  c.train.seq_len = 8;
  c.train.threads = 1;
  c.precision.dtype = "fp16";
  c.precision.loss_scale_init = loss_scale;
  return c;
}

std::vector<Batch> batch() {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(3);
  const at::Tensor tokens = at::randint(32, {2, 9}, gen, at::kLong);
  return {{tokens.narrow(1, 0, 8).contiguous(), tokens.narrow(1, 1, 8).contiguous()}};
}

TEST(TrainStepFp16, OverflowIsSkippedByRunItself) {
  // 2^40 times the loss overflows fp16 (max 65504) in backward.
  TrainStep step(tiny_fp16(std::ldexp(1.0, 40)));
  std::map<std::string, at::Tensor> before;
  for (const auto& item : step.model()->named_parameters()) before[item.key()] = item.value().clone();
  const StepResult skipped = step.run(batch(), 1e-2);
  EXPECT_TRUE(skipped.skipped);
  EXPECT_DOUBLE_EQ(step.loss_scaler()->value(), std::ldexp(1.0, 39));  // backoff 0.5
  for (const auto& item : step.model()->named_parameters())
    EXPECT_TRUE(at::equal(item.value(), before.at(item.key()))) << item.key() << " moved on a skipped step";
  for (const auto& item : step.model()->named_parameters())
    EXPECT_FALSE(item.value().grad().defined()) << item.key() << ": gradients kept after a skipped step";

  TrainStep finite(tiny_fp16(1024));
  const StepResult taken = finite.run(batch(), 1e-2);
  EXPECT_FALSE(taken.skipped);
  EXPECT_GT(taken.grad_norm, 0);
  EXPECT_TRUE(std::isfinite(taken.grad_norm));
  bool moved = false;
  for (const auto& item : finite.model()->named_parameters()) moved = moved || !at::equal(item.value(), before.at(item.key()));
  EXPECT_TRUE(moved);
}

}  // namespace
}  // namespace tessera
