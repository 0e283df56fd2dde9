// AdamW, Adafactor and SGD against PyTorch / Python-reference trajectories (golden_optim.py), fused
// vs per-tensor AdamW, the state round trip, load_state errors and parameters without gradients.
//
// Tolerances: rtol 1e-6, atol 1e-7 (fp32). Measured: both AdamW paths are bit-identical to
// torch.optim.AdamW(foreach=False); Adafactor is within 1 ulp (max |diff| 6e-8 on values ~0.8),
// because the golden computes its scalars (RMS, alpha) in float64 on the host while here they
// stay float32 device tensors.
#include <gtest/gtest.h>

#include <torch/types.h>
#include <torch/utils.h>

#include "core/error.h"
#include "optim/optimizer.h"
#include "test_util.h"

namespace tessera {
namespace {

const std::vector<std::string> kNames = {"w", "t", "b"};

struct Golden {
  SafetensorsContents file = test::golden("optim_trajectories.safetensors");
  const at::Tensor& get(const std::string& name) const { return file.tensors.at(name); }
  double lr(int64_t k) const { return get("lr")[k].item<double>(); }
};

NamedParams initial_params(const Golden& g) {
  NamedParams params;
  for (const auto& n : kNames) params.emplace_back(n, g.get("init." + n).clone().requires_grad_(true));
  return params;
}

void set_grads(NamedParams& params, const Golden& g, int64_t k) {
  for (auto& [n, p] : params) p.mutable_grad() = g.get("grad" + std::to_string(k) + "." + n).clone();
}

OptimOptions adamw_options(bool fused) {
  OptimOptions o;
  o.name = "adamw";
  o.fused = fused;
  return o;  // betas (0.9, 0.95), eps 1e-8, weight decay 0.1: as golden_optim.py
}

OptimOptions adafactor_options(bool relative) {
  OptimOptions o;
  o.name = "adafactor";
  if (!relative) {  // golden "adafactor_lr"
    o.adafactor_relative_step = false;
    o.adafactor_scale_parameter = false;
    o.adafactor_beta1 = 0.9;
  }
  return o;
}

OptimOptions sgd_options(bool nesterov, double momentum = 0.9) {
  OptimOptions o;
  o.name = "sgd";
  o.momentum = momentum;
  o.nesterov = nesterov;
  return o;  // weight decay 0.1 (L2) on matrices: as golden_optim.py
}

void expect_trajectory(const OptimOptions& options, const std::string& tag) {
  Golden g;
  NamedParams params = initial_params(g);
  auto opt = make_optimizer(options, params);
  for (int64_t k = 0; k < 3; ++k) {
    set_grads(params, g, k);
    opt->step(g.lr(k));
    for (const auto& [n, p] : params)
      EXPECT_TRUE(test::all_close(p, g.get(tag + "." + std::to_string(k) + "." + n), 1e-6, 1e-7))
          << tag << " step " << k << " param " << n;
  }
}

TEST(AdamW, FusedMatchesTorch) { expect_trajectory(adamw_options(true), "adamw"); }
TEST(AdamW, PerTensorMatchesTorch) { expect_trajectory(adamw_options(false), "adamw"); }
TEST(SGD, HeavyBallMatchesTorch) { expect_trajectory(sgd_options(false), "sgd"); }
TEST(SGD, NesterovMatchesTorch) { expect_trajectory(sgd_options(true), "sgd_nesterov"); }

TEST(SGD, WithoutMomentumIsPlainGradientDescentWithNoState) {
  Golden g;
  NamedParams params = initial_params(g);
  auto opt = make_optimizer(sgd_options(false, 0.0), params);
  EXPECT_TRUE(opt->state().empty());
  set_grads(params, g, 0);
  opt->step(0.5);
  // w decays (L2 on matrices): w - lr (g + wd w); b does not.
  EXPECT_TRUE(test::all_close(params[0].second, g.get("init.w") - 0.5 * (g.get("grad0.w") + 0.1 * g.get("init.w")), 1e-6, 1e-7));
  EXPECT_TRUE(test::all_close(params[2].second, g.get("init.b") - 0.5 * g.get("grad0.b"), 1e-6, 1e-7));
}

TEST(SGD, UpdateIsProportionalToTheGradient) {
  // The property the equivalence harness relies on: a gradient twice as large moves the
  // parameters twice as far (AdamW's normalised update would not). The moves are 1e-3..1e-2 on
  // values near 1, so each carries float32's rounding of the parameter (1.2e-7): atol 5e-7.
  Golden g;
  OptimOptions o = sgd_options(true);
  o.weight_decay = 0;
  NamedParams a = initial_params(g), b = initial_params(g);
  auto oa = make_optimizer(o, a), ob = make_optimizer(o, b);
  set_grads(a, g, 0);
  set_grads(b, g, 0);
  for (auto& [n, p] : b) p.mutable_grad().mul_(2);
  oa->step(1e-2);
  ob->step(1e-2);
  for (size_t i = 0; i < a.size(); ++i) {
    const std::string& n = a[i].first;
    EXPECT_TRUE(test::all_close(b[i].second - g.get("init." + n), 2 * (a[i].second - g.get("init." + n)), 1e-5, 5e-7)) << n;
  }
}

TEST(Adafactor, RelativeStepMatchesReference) { expect_trajectory(adafactor_options(true), "adafactor"); }
TEST(Adafactor, ExplicitLrWithFirstMomentMatchesReference) {
  expect_trajectory(adafactor_options(false), "adafactor_lr");
}

TEST(AdamW, FusedEqualsPerTensor) {
  Golden g;
  NamedParams a = initial_params(g), b = initial_params(g);
  auto fused = make_optimizer(adamw_options(true), a);
  auto plain = make_optimizer(adamw_options(false), b);
  for (int64_t k = 0; k < 3; ++k) {
    set_grads(a, g, k);
    set_grads(b, g, k);
    fused->step(g.lr(k));
    plain->step(g.lr(k));
  }
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(test::all_close(a[i].second, b[i].second, 1e-6, 1e-8)) << a[i].first;
  auto sa = fused->state(), sb = plain->state();
  ASSERT_EQ(sa.size(), sb.size());
  for (size_t i = 0; i < sa.size(); ++i)
    EXPECT_TRUE(test::all_close(sa[i].second, sb[i].second, 1e-6, 1e-12)) << sa[i].first;
}

// Two steps, save, load into a fresh optimizer on a copy of the parameters, one more step on
// both: bit-identical. A fresh optimizer that skips the load must differ (the test can fail).
void expect_round_trip(const OptimOptions& options) {
  Golden g;
  NamedParams a = initial_params(g);
  auto original = make_optimizer(options, a);
  for (int64_t k = 0; k < 2; ++k) {
    set_grads(a, g, k);
    original->step(g.lr(k));
  }
  std::map<std::string, at::Tensor> saved;
  for (const auto& [name, t] : original->state()) saved[name] = t.clone();

  NamedParams b, c;
  for (const auto& [n, p] : a) {
    b.emplace_back(n, p.detach().clone().requires_grad_(true));
    c.emplace_back(n, p.detach().clone().requires_grad_(true));
  }
  auto restored = make_optimizer(options, b);
  restored->load_state(saved, "ckpt/optimizer.safetensors");
  auto unrestored = make_optimizer(options, c);
  set_grads(a, g, 2);
  set_grads(b, g, 2);
  set_grads(c, g, 2);
  original->step(g.lr(2));
  restored->step(g.lr(2));
  unrestored->step(g.lr(2));
  bool any_differs = false;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(at::equal(a[i].second, b[i].second)) << options.name << " " << a[i].first;
    any_differs = any_differs || !at::equal(a[i].second, c[i].second);
  }
  EXPECT_TRUE(any_differs);
  auto sa = original->state(), sb = restored->state();
  for (size_t i = 0; i < sa.size(); ++i) EXPECT_TRUE(at::equal(sa[i].second, sb[i].second)) << sa[i].first;
}

TEST(OptimizerState, RoundTripIsBitIdentical) {
  expect_round_trip(adamw_options(true));
  expect_round_trip(adamw_options(false));
  expect_round_trip(adafactor_options(true));
  expect_round_trip(adafactor_options(false));
  expect_round_trip(sgd_options(true));
  expect_round_trip(sgd_options(false));
}

TEST(OptimizerState, NamesSlotsPerParameter) {
  Golden g;
  std::vector<std::string> adamw, adafactor;
  for (const auto& e : make_optimizer(adamw_options(true), initial_params(g))->state()) adamw.push_back(e.first);
  for (const auto& e : make_optimizer(adafactor_options(false), initial_params(g))->state())
    adafactor.push_back(e.first);
  EXPECT_EQ(adamw, (std::vector<std::string>{"w.exp_avg", "w.exp_avg_sq", "w.step", "t.exp_avg", "t.exp_avg_sq",
                                             "t.step", "b.exp_avg", "b.exp_avg_sq", "b.step"}));
  EXPECT_EQ(adafactor, (std::vector<std::string>{"w.exp_avg_sq_row", "w.exp_avg_sq_col", "w.exp_avg", "w.step",
                                                 "t.exp_avg_sq_row", "t.exp_avg_sq_col", "t.exp_avg", "t.step",
                                                 "b.exp_avg_sq", "b.exp_avg", "b.step"}));
  auto state = make_optimizer(adafactor_options(true), initial_params(g))->state();
  EXPECT_EQ(state[0].second.sizes(), (at::IntArrayRef{4}));     // w [4, 6]: rows
  EXPECT_EQ(state[1].second.sizes(), (at::IntArrayRef{6}));     // columns
  EXPECT_EQ(state[3].second.sizes(), (at::IntArrayRef{2, 3}));  // t [2, 3, 5]: rows per batch
  EXPECT_EQ(state[4].second.sizes(), (at::IntArrayRef{2, 5}));
}

// Each optimizer declares what its state holds (core/state_kind.h), so that a checkpoint reader
// checks second moments for sign and steps as counters without knowing the slot names.
TEST(OptimizerState, DeclaresWhatEachSlotHolds) {
  Golden g;
  auto kinds = [&](const OptimOptions& options) {
    auto opt = make_optimizer(options, initial_params(g));
    std::map<std::string, StateKind> out;
    for (const auto& e : opt->state()) out[e.first] = opt->state_kind(e.first);
    return out;
  };
  const auto adamw = kinds(adamw_options(true));
  EXPECT_EQ(adamw.at("w.exp_avg"), StateKind::real);
  EXPECT_EQ(adamw.at("w.exp_avg_sq"), StateKind::non_negative);
  EXPECT_EQ(adamw.at("b.step"), StateKind::counter);
  const auto adafactor = kinds(adafactor_options(false));
  EXPECT_EQ(adafactor.at("w.exp_avg_sq_row"), StateKind::non_negative);
  EXPECT_EQ(adafactor.at("w.exp_avg_sq_col"), StateKind::non_negative);
  EXPECT_EQ(adafactor.at("b.exp_avg_sq"), StateKind::non_negative);
  EXPECT_EQ(adafactor.at("w.exp_avg"), StateKind::real);
  EXPECT_EQ(adafactor.at("t.step"), StateKind::counter);
  const auto sgd = kinds(sgd_options(false));
  EXPECT_EQ(sgd.at("w.momentum_buffer"), StateKind::real);
  EXPECT_EQ(sgd.at("w.step"), StateKind::counter);
}

void expect_load_error(std::map<std::string, at::Tensor> state, const std::string& needle) {
  Golden g;
  auto opt = make_optimizer(adamw_options(true), initial_params(g));
  try {
    opt->load_state(state, "ckpt/optimizer.safetensors");
    FAIL() << "expected an error mentioning " << needle;
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("ckpt/optimizer.safetensors"), std::string::npos) << m;
    EXPECT_NE(m.find(needle), std::string::npos) << m;
  }
}

TEST(OptimizerState, LoadRefusesMissingExtraAndMisshapen) {
  Golden g;
  std::map<std::string, at::Tensor> good;
  for (const auto& [n, t] : make_optimizer(adamw_options(true), initial_params(g))->state()) good[n] = t.clone();
  auto missing = good;
  missing.erase("t.exp_avg_sq");
  expect_load_error(missing, "t.exp_avg_sq is missing");
  auto extra = good;
  extra["q.exp_avg"] = torch::zeros({2});
  expect_load_error(extra, "unexpected optimizer state q.exp_avg");
  auto misshapen = good;
  misshapen["w.exp_avg"] = torch::zeros({6, 4});
  expect_load_error(misshapen, "w.exp_avg has shape [6, 4], expected [4, 6]");
}

TEST(Optimizer, ParametersWithoutGradAreSkipped) {
  for (const auto& options : {adamw_options(true), adamw_options(false), adafactor_options(true), sgd_options(true)}) {
    Golden g;
    NamedParams params = initial_params(g);
    auto opt = make_optimizer(options, params);
    params[0].second.mutable_grad() = g.get("grad0.w").clone();
    opt->step(1e-2);
    EXPECT_FALSE(at::equal(params[0].second, g.get("init.w"))) << options.name;
    EXPECT_TRUE(at::equal(params[2].second, g.get("init.b"))) << options.name;
    for (const auto& [name, t] : opt->state()) {
      if (name == "b.step") {
        EXPECT_EQ(t.item<double>(), 0.0) << options.name;
      }
    }
    opt->zero_grad();
    EXPECT_FALSE(params[0].second.grad().defined());
  }
}

TEST(AdamW, WeightDecayOnlyOnMatrices) {
  // With zero gradients the Adam term is 0, so a step is exactly p *= 1 - lr * wd on 2+-dim params.
  for (bool fused : {true, false}) {
    Golden g;
    NamedParams params = initial_params(g);
    auto opt = make_optimizer(adamw_options(fused), params);
    for (auto& [n, p] : params) p.mutable_grad() = torch::zeros_like(p);
    opt->step(0.5);
    EXPECT_TRUE(test::all_close(params[0].second, g.get("init.w") * (1 - 0.5 * 0.1), 1e-6, 0)) << fused;
    EXPECT_TRUE(test::all_close(params[1].second, g.get("init.t") * (1 - 0.5 * 0.1), 1e-6, 0)) << fused;
    EXPECT_TRUE(at::equal(params[2].second, g.get("init.b"))) << fused;
  }
}

}  // namespace
}  // namespace tessera
