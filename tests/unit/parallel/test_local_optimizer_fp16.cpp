// LocalOptimizer under fp16 (parallel/local_optimizer.h) when the step's gradients are replaced
// by written ones before the update, as the ATOM swarm's round mean replaces them: whether the
// update is skipped follows the written gradients (the same on every peer of the round), while the
// loss scale follows this process's own backward; a dropped step updates the scale too.
#include <gtest/gtest.h>

#include <limits>

#include <torch/types.h>
#include <torch/utils.h>

#include "parallel/local_optimizer.h"

namespace tessera {
namespace {

struct Fixture {
  at::Tensor w = at::full({4}, 1.0, at::kHalf).requires_grad_(true);
  LocalOptimizer owner;
  Fixture() : owner({{"w", w}}, sgd(), fp16(), at::kCPU) {}
  static OptimOptions sgd() {
    OptimOptions o;
    o.name = "sgd";
    o.momentum = 0;
    o.weight_decay = 0;
    return o;
  }
  static PrecisionOptions fp16() {
    PrecisionOptions p;
    p.dtype = "fp16";
    p.loss_scale_init = 1024;
    return p;
  }
  // this step's own backward: fp16 gradients at the loss scale, `value` after unscaling
  void backward(float value) {
    w.mutable_grad() = at::full({4}, value * owner.loss_scale(), at::kHalf);
    owner.finish_gradients();
  }
  void write(float value) {
    for (at::Tensor& g : owner.final_gradients()) g.fill_(value);
    owner.gradients_written();
  }
};

TEST(LocalOptimizerFp16, AFiniteWrittenMeanIsAppliedAfterTheStepsOwnOverflow) {
  Fixture f;
  f.backward(std::numeric_limits<float>::infinity());
  f.write(0.5);
  const UpdateResult r = f.owner.apply(0.1, 0);
  EXPECT_FALSE(r.skipped);
  EXPECT_TRUE(at::allclose(f.w.to(at::kFloat), at::full({4}, 0.95), 0, 1e-3));  // 1 - 0.1 * 0.5, in fp16
  EXPECT_EQ(f.owner.loss_scale(), 512);  // lowered: this process's backward overflowed at 1024
}

TEST(LocalOptimizerFp16, ANonFiniteWrittenMeanIsSkippedWithoutLoweringTheScale) {
  Fixture f;
  f.backward(0.25);
  f.write(std::numeric_limits<float>::quiet_NaN());
  const UpdateResult r = f.owner.apply(0.1, 0);
  EXPECT_TRUE(r.skipped);
  EXPECT_TRUE(at::equal(f.w, at::full({4}, 1.0, at::kHalf)));
  EXPECT_EQ(f.owner.loss_scale(), 1024);
  EXPECT_EQ(f.owner.loss_scaler()->good_steps(), 1);
}

TEST(LocalOptimizerFp16, ADroppedStepStillLowersTheScaleAfterAnOverflow) {
  Fixture f;
  f.backward(std::numeric_limits<float>::infinity());
  f.owner.drop_gradients();
  EXPECT_EQ(f.owner.loss_scale(), 512);
  f.backward(0.25);
  f.owner.drop_gradients();
  EXPECT_EQ(f.owner.loss_scale(), 512);
  EXPECT_EQ(f.owner.loss_scaler()->good_steps(), 1);
  EXPECT_TRUE(at::equal(f.w, at::full({4}, 1.0, at::kHalf)));
}

}  // namespace
}  // namespace tessera
