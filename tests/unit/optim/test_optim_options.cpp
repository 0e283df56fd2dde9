// [optim] checks and the learning-rate schedule against its closed forms (optim_options.h).
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "optim/optim_options.h"

namespace tessera {
namespace {

OptimOptions schedule(const std::string& kind, int64_t warmup) {
  OptimOptions o;
  o.lr = 6e-4;
  o.min_lr_ratio = 0.1;
  o.warmup_steps = warmup;
  o.schedule = kind;
  return o;
}

TEST(Schedule, WarmupIsLinearFromLrOverWarmup) {
  OptimOptions o = schedule("cosine", 20);
  for (int64_t s = 0; s < 20; ++s) EXPECT_DOUBLE_EQ(learning_rate(o, s, 100), 6e-4 * (s + 1) / 20.0) << s;
}

TEST(Schedule, CosineMatchesClosedForm) {
  OptimOptions o = schedule("cosine", 10);
  const double lr = 6e-4, floor = 6e-5;
  EXPECT_DOUBLE_EQ(learning_rate(o, 10, 110), lr);
  EXPECT_NEAR(learning_rate(o, 60, 110), (lr + floor) / 2, 1e-18);
  EXPECT_NEAR(learning_rate(o, 35, 110), floor + (lr - floor) * 0.5 * (1 + std::cos(M_PI * 0.25)), 1e-18);
  EXPECT_DOUBLE_EQ(learning_rate(o, 110, 110), floor);
  EXPECT_DOUBLE_EQ(learning_rate(o, 500, 110), floor);
  for (int64_t s = 11; s < 110; ++s) EXPECT_LT(learning_rate(o, s, 110), learning_rate(o, s - 1, 110)) << s;
}

TEST(Schedule, LinearAndConstant) {
  OptimOptions lin = schedule("linear", 10);
  EXPECT_DOUBLE_EQ(learning_rate(lin, 10, 110), 6e-4);
  EXPECT_NEAR(learning_rate(lin, 35, 110), 6e-5 + (6e-4 - 6e-5) * 0.75, 1e-18);
  EXPECT_DOUBLE_EQ(learning_rate(lin, 110, 110), 6e-5);
  OptimOptions constant = schedule("constant", 10);
  EXPECT_DOUBLE_EQ(learning_rate(constant, 5, 110), 6e-4 * 6 / 10.0);
  EXPECT_DOUBLE_EQ(learning_rate(constant, 100, 110), 6e-4);
}

TEST(Schedule, NoWarmupStartsAtPeak) {
  OptimOptions o = schedule("cosine", 0);
  EXPECT_DOUBLE_EQ(learning_rate(o, 0, 50), 6e-4);
  EXPECT_NEAR(learning_rate(o, 25, 50), (6e-4 + 6e-5) / 2, 1e-18);
}

void expect_check_error(OptimOptions o, const std::string& needle) {
  try {
    o.check("run.toml");
    FAIL() << "expected an error mentioning " << needle;
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("run.toml: optim." + needle), std::string::npos) << m;
  }
}

TEST(OptimOptions, CheckNamesTheKey) {
  OptimOptions ok;
  EXPECT_NO_THROW(ok.check("run.toml"));
  OptimOptions o;
  o.name = "lamb";
  expect_check_error(o, "name must be adamw, adafactor or sgd (got lamb)");
  o = {};
  o.name = "sgd";
  o.momentum = 0;
  o.nesterov = true;
  expect_check_error(o, "nesterov = true needs optim.momentum > 0");
  o = {};
  o.momentum = 1.0;
  expect_check_error(o, "momentum");
  o = {};
  o.schedule = "step";
  expect_check_error(o, "schedule");
  o = {};
  o.lr = 0;
  expect_check_error(o, "lr");
  o = {};
  o.beta2 = 1.0;
  expect_check_error(o, "beta2");
  o = {};
  o.min_lr_ratio = 1.5;
  expect_check_error(o, "min_lr_ratio");
  o = {};
  o.grad_clip = -1;
  expect_check_error(o, "grad_clip");
  o = {};
  o.adafactor_decay_rate = 0.5;
  expect_check_error(o, "adafactor_decay_rate");
}

}  // namespace
}  // namespace tessera
