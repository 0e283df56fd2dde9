// fp16 on the CPU: half matmul works in this torch, and Megatron-style training (fp16 model,
// fp32 masters, dynamic loss scale) of a tiny linear regression tracks an fp32 run; an injected
// inf skips the step and halves the scale.
#include <gtest/gtest.h>

#include <limits>

#include <torch/types.h>
#include <torch/utils.h>

#include "optim/optimizer.h"
#include "precision/fp16.h"
#include "test_util.h"

namespace tessera {
namespace {

TEST(Fp16, CpuMatmulWorks) {
  auto a = torch::randn({64, 64}), b = torch::randn({64, 64});
  auto half = at::matmul(a.to(at::kHalf), b.to(at::kHalf));
  EXPECT_EQ(half.scalar_type(), at::kHalf);
  // Inputs rounded to fp16 (rel 2^-11) and an fp16 result: |error| ~ 1e-2 for sums of 64 products.
  EXPECT_TRUE(test::all_close(half, at::matmul(a.to(at::kHalf).to(at::kFloat), b.to(at::kHalf).to(at::kFloat)),
                              2e-3, 2e-2));
}

struct Regression {
  at::Tensor x, y;  // x [64, 8], y [64, 4] = x W*^T + b*
  Regression() {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
    x = at::randn({64, 8}, gen);
    auto w = at::randn({4, 8}, gen), b = at::randn({4}, gen);
    y = at::linear(x, w, b);
  }
};

NamedParams init_params(at::ScalarType dtype) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  auto w = (at::randn({4, 8}, gen) * 0.3).to(dtype).requires_grad_(true);
  auto b = at::zeros({4}, at::TensorOptions().dtype(dtype)).requires_grad_(true);
  return {{"w", w}, {"b", b}};
}

at::Tensor loss_of(const NamedParams& params, const Regression& data) {
  auto dtype = params[0].second.scalar_type();
  auto pred = at::linear(data.x.to(dtype), params[0].second, params[1].second);
  return (pred.to(at::kFloat) - data.y).pow(2).mean();
}

OptimOptions adam() {
  OptimOptions o;
  o.lr = 2e-2;
  return o;
}

TEST(MasterWeights, Fp16TrainingTracksFp32) {
  Regression data;
  NamedParams ref = init_params(at::kFloat);
  auto ref_opt = make_optimizer(adam(), ref);
  NamedParams model = init_params(at::kHalf);
  MasterWeights masters(model);
  ASSERT_EQ(masters.master()[0].second.scalar_type(), at::kFloat);
  auto opt = make_optimizer(adam(), masters.master());
  PrecisionOptions popts;
  popts.dtype = "fp16";
  popts.loss_scale_init = 1024;
  DynamicLossScaler scaler(popts);

  double ref_loss = 0, fp16_loss = 0, first_loss = 0;
  for (int step = 0; step < 30; ++step) {
    auto l = loss_of(ref, data);
    ref_loss = l.item<double>();
    l.backward();
    ref_opt->step(2e-2);
    ref_opt->zero_grad();

    auto l16 = loss_of(model, data);
    fp16_loss = l16.item<double>();
    if (step == 0) first_loss = fp16_loss;
    (l16 * scaler.scale()).backward();
    bool found_inf = masters.copy_grads_to_master(1.0 / scaler.value());
    scaler.update(found_inf);
    ASSERT_FALSE(found_inf) << "step " << step;
    opt->step(2e-2);
    masters.copy_master_to_model();
    opt->zero_grad();
    for (auto& [n, p] : model) p.mutable_grad().reset();
  }
  EXPECT_LT(fp16_loss, 0.5 * first_loss);
  EXPECT_NEAR(fp16_loss, ref_loss, 3e-4 * ref_loss);  // measured: 7e-5 relative
  // fp16 forward/backward error (rel ~1e-3) accumulated over 30 Adam steps of size ~2e-2;
  // measured max |diff| 2.2e-4 on parameters of size ~0.1-1.
  for (size_t i = 0; i < ref.size(); ++i) {
    EXPECT_TRUE(test::all_close(masters.master()[i].second, ref[i].second, 0, 1e-3)) << ref[i].first;
    EXPECT_TRUE(at::equal(model[i].second, masters.master()[i].second.to(at::kHalf))) << ref[i].first;
  }
}

TEST(MasterWeights, GradsAreUnscaledIntoMasters) {
  NamedParams model = init_params(at::kHalf);
  MasterWeights masters(model);
  model[0].second.mutable_grad() = at::randn({4, 8}).to(at::kHalf) * 256;
  EXPECT_FALSE(masters.copy_grads_to_master(1.0 / 256));
  EXPECT_TRUE(at::equal(masters.master()[0].second.grad(), model[0].second.grad().to(at::kFloat) / 256));
  EXPECT_FALSE(masters.master()[1].second.grad().defined());  // b had no grad
}

TEST(MasterWeights, InfSkipsStepAndHalvesScale) {
  Regression data;
  NamedParams model = init_params(at::kHalf);
  MasterWeights masters(model);
  auto opt = make_optimizer(adam(), masters.master());
  PrecisionOptions popts;
  popts.dtype = "fp16";
  DynamicLossScaler scaler(popts);
  auto before = masters.master()[0].second.detach().clone();
  auto model_before = model[0].second.detach().clone();

  (loss_of(model, data) * scaler.scale()).backward();
  model[0].second.grad()[1][2] = std::numeric_limits<float>::infinity();
  bool found_inf = masters.copy_grads_to_master(1.0 / scaler.value());
  EXPECT_TRUE(found_inf);
  scaler.update(found_inf);
  EXPECT_EQ(scaler.value(), 32768);
  if (!found_inf) opt->step(1e-2);  // the trainer's rule: an overflow step is skipped
  opt->zero_grad();
  EXPECT_TRUE(at::equal(masters.master()[0].second, before));
  EXPECT_TRUE(at::equal(model[0].second, model_before));
}

}  // namespace
}  // namespace tessera
