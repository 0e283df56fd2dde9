// Activation checkpointing gives the same loss and gradients as running without it, with dropout
// active (which needs the RNG restore), for GPT, linear and MoE models in modes full and
// selective; the RNG stream after backward is the same as without checkpointing; the generic
// checkpoint() works on its own; a recomputation under bf16 autocast leaves no cast weight behind
// for the next step's forward; unknown modes are refused by name.
//
// The recomputation runs the same kernels on the same inputs, so results are compared with
// rtol 1e-6 / atol 1e-7 (bitwise equality is expected on CPU, the slack covers kernel dispatch).
#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include "core/error.h"
#include "memory/activation_checkpointing.h"
#include "precision/autocast.h"
#include "model/transformer.h"
#include "unit/model/small_model.h"
#include "test_util.h"

namespace tessera {
namespace {

struct Run {
  at::Tensor loss;
  std::map<std::string, at::Tensor> grads;
  at::Tensor next_random;  // a draw after backward: the RNG stream must be left as without checkpointing
};

Run train_step(const ModelOptions& opts, const std::string& mode) {
  torch::manual_seed(11);
  TransformerLM model(opts);
  model->set_activation_checkpointing(mode);
  model->train();
  auto idx = torch::randint(0, opts.vocab_size, {2, 20});
  auto targets = torch::randint(0, opts.vocab_size, {2, 20});
  torch::manual_seed(12);  // dropout masks
  auto out = model->forward(idx, targets);
  out.loss.backward();
  Run r{out.loss.detach(), {}, torch::rand({4})};
  for (auto& p : model->named_parameters()) r.grads[p.key()] = p.value().grad();
  return r;
}

ModelOptions small(const std::string& arch, const std::string& ffn) { return test::small_model(arch, ffn, 16, 0.2); }

class CheckpointModes : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(CheckpointModes, SameGradientsAsWithout) {
  auto [arch, ffn] = GetParam();
  auto opts = small(arch, ffn);
  auto base = train_step(opts, "none");
  auto no_dropout = opts;
  no_dropout.dropout = 0;
  EXPECT_FALSE(torch::allclose(base.loss, train_step(no_dropout, "none").loss)) << "dropout must be active";
  for (const std::string mode : {"full", "selective"}) {
    auto run = train_step(opts, mode);
    EXPECT_TRUE(test::all_close(run.loss, base.loss, 1e-6, 1e-7)) << mode;
    EXPECT_TRUE(torch::equal(run.next_random, base.next_random)) << mode << ": RNG stream disturbed";
    for (const auto& [name, g] : base.grads) {
      ASSERT_TRUE(run.grads.at(name).defined()) << mode << " " << name;
      EXPECT_TRUE(test::all_close(run.grads.at(name), g, 1e-6, 1e-7)) << mode << " " << name;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, CheckpointModes,
                         ::testing::Values(std::make_tuple("gpt", "dense"), std::make_tuple("linear", "dense"),
                                           std::make_tuple("gpt", "moe"), std::make_tuple("linear", "moe")));

TEST(Checkpoint, FunctionWithDropoutAndParameter) {
  auto w = torch::randn({8, 8}).requires_grad_();
  auto fn = [&](const at::Tensor& x) { return torch::dropout(at::tanh(x.matmul(w)), 0.5, true).sum(-1); };
  auto x = torch::randn({4, 8});
  auto x1 = x.clone().requires_grad_(), x2 = x.clone().requires_grad_();
  torch::manual_seed(5);
  fn(x1).pow(2).sum().backward();
  auto gw = w.grad().clone();
  w.mutable_grad().zero_();
  torch::manual_seed(5);
  auto y = checkpoint(fn, x2);
  EXPECT_FALSE(y.grad_fn() == nullptr);
  y.pow(2).sum().backward();
  EXPECT_TRUE(test::all_close(x2.grad(), x1.grad(), 1e-6, 1e-7));
  EXPECT_TRUE(test::all_close(w.grad(), gw, 1e-6, 1e-7));
}

// Autocast caches its bf16 copy of a weight until the outermost autocast region ends. The
// recomputation runs in the backward, outside any region: its copy must go with it, or the next
// step's forward, after the optimizer has changed the weight, multiplies by the old one.
TEST(Checkpoint, ABf16RecomputationLeavesNoCastWeightForTheNextForward) {
  auto w = torch::randn({8, 8}).requires_grad_();
  auto fn = [&](const at::Tensor& x) { return at::tanh(x.matmul(w)); };
  auto x = torch::randn({4, 8});
  at::Tensor y;
  {
    AutocastGuard guard(at::kCPU, at::kBFloat16);
    y = checkpoint(fn, x.clone().requires_grad_());
  }
  y.to(at::kFloat).sum().backward();  // the recomputation: autocast on, as in the forward
  {
    torch::NoGradGuard no_grad;
    w.add_(1.0);  // the optimizer's step
  }
  AutocastGuard guard(at::kCPU, at::kBFloat16);
  EXPECT_TRUE(at::equal(fn(x), at::tanh(x.to(at::kBFloat16).matmul(w.detach().to(at::kBFloat16)))));
}

TEST(Checkpoint, UnknownModeNamesTheKey) {
  TransformerLM model(small("gpt", "dense"));
  try {
    model->set_activation_checkpointing("partial");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("memory.activation_checkpointing"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("partial"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tessera
