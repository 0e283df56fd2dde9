// MoE routing: capacity is respected and slots are assigned by priority (all first choices in token
// order, then second choices); with a tiny capacity factor, dropped tokens get exactly zero output;
// the load-balancing and z-losses match their formulas on hand-built routers.
#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <cmath>
#include <functional>

#include "model/init.h"
#include "model/moe.h"
#include "model/transformer.h"
#include "test_util.h"

namespace tessera {
namespace {

ModelOptions moe_options(int64_t top_k, double capacity_factor) {
  ModelOptions o;
  o.ffn = "moe";
  o.n_embd = 16;
  o.n_head = 2;
  o.moe_experts = 4;
  o.moe_top_k = top_k;
  o.moe_capacity_factor = capacity_factor;
  return o;
}

// A standalone layer, initialised from its declarations as a model would.
MoE make_moe(const ModelOptions& o) {
  MoE moe(o, at::TensorOptions());
  initialize_parameters(*moe, moe->parameter_specs(), 7);
  return moe;
}

// Dropless experts (at::_grouped_mm over variable runs, or one matmul pair per expert where strides
// do not allow it; the output summed directly, whose gradient has zero strides) equal the padded
// batched matmul of a capacity that drops nothing (2 * 40 / 4 * 4 = 80 rows >= any count): outputs,
// w_fc's gradient and that of one more parameter.
void expect_expert_paths_agree(ModelOptions o, const std::function<at::Tensor(MoEImpl&)>& other) {
  MoE dropless = make_moe(o);
  o.moe_capacity_factor = 4.0;
  MoE padded = make_moe(o);
  const at::Tensor tokens = torch::randn({1, 40, o.n_embd});
  const at::Tensor y = dropless->forward(tokens).y, y_padded = padded->forward(tokens).y;
  EXPECT_TRUE(torch::allclose(y, y_padded, 1e-5, 1e-6));
  y.sum().backward();
  y_padded.sum().backward();
  EXPECT_TRUE(torch::allclose(dropless->w_fc.grad(), padded->w_fc.grad(), 1e-5, 1e-6));
  EXPECT_TRUE(torch::allclose(other(*dropless).grad(), other(*padded).grad(), 1e-5, 1e-6));
}

TEST(MoE, CapacityFormula) {
  EXPECT_EQ(expert_capacity(48, 4, 1, 1.25), 15);  // ceil(15.0)
  EXPECT_EQ(expert_capacity(48, 4, 2, 1.25), 30);
  EXPECT_EQ(expert_capacity(10, 4, 1, 1.0), 3);    // ceil(2.5)
  EXPECT_EQ(expert_capacity(40, 4, 1, 0.1), 1);
}

class MoECapacity : public ::testing::TestWithParam<std::tuple<int64_t, double>> {};

TEST_P(MoECapacity, SlotsAreUniqueBelowCapacityAndInPriorityOrder) {
  auto [top_k, factor] = GetParam();
  torch::manual_seed(1);
  MoE moe = make_moe(moe_options(top_k, factor));
  {
    torch::NoGradGuard no_grad;
    moe->router->weight.normal_(0, 1.0);  // uneven routing, so some experts overflow
  }
  const int64_t N = 64;
  auto x = torch::randn({N, 16});
  auto r = moe->route(x);
  ASSERT_EQ(r.capacity, expert_capacity(N, 4, top_k, factor));
  auto expert = r.expert.contiguous(), slot = r.slot.contiguous();
  std::vector<int64_t> next(4, 0);  // expected next slot of each expert, in priority order
  std::vector<std::set<int64_t>> used(4);
  int64_t dropped = 0;
  for (int64_t c = 0; c < top_k; ++c) {
    for (int64_t n = 0; n < N; ++n) {
      const int64_t e = expert[n][c].item<int64_t>(), s = slot[n][c].item<int64_t>();
      const int64_t want = next[e]++;
      if (want < r.capacity) {
        EXPECT_EQ(s, want) << "token " << n << " choice " << c;
        EXPECT_TRUE(used[e].insert(s).second);
        EXPECT_GT(r.gate[n][c].item<float>(), 0.0f);
      } else {
        EXPECT_EQ(s, r.capacity) << "dropped choice goes to the overflow slot";
        EXPECT_EQ(r.gate[n][c].item<float>(), 0.0f);
        ++dropped;
      }
    }
  }
  for (int64_t e = 0; e < 4; ++e) {
    EXPECT_LE(static_cast<int64_t>(used[e].size()), r.capacity);
    EXPECT_EQ(r.assigned[e].item<int64_t>(), next[e]);
  }
  moe->reset_statistics();
  moe->forward(x.view({2, 32, 16}));
  const auto& stats = moe->statistics();
  EXPECT_EQ(stats.forwards, 1);
  EXPECT_LE(stats.kept.max().item<int64_t>(), r.capacity);
  EXPECT_NEAR(stats.dropped_fraction(), static_cast<double>(dropped) / static_cast<double>(N * top_k), 1e-12);
}

INSTANTIATE_TEST_SUITE_P(MoE, MoECapacity,
                         ::testing::Values(std::make_tuple(int64_t{1}, 1.0), std::make_tuple(int64_t{2}, 1.25),
                                           std::make_tuple(int64_t{2}, 0.5), std::make_tuple(int64_t{1}, 0.1)));

TEST(MoE, TinyCapacityDropsTokensAndTheirOutputIsZero) {
  torch::manual_seed(2);
  MoE moe = make_moe(moe_options(1, 0.1));  // capacity = ceil(40 / 4 * 0.1) = 1
  auto x = torch::randn({1, 40, 16}).requires_grad_();
  auto out = moe->forward(x);
  auto r = moe->route(x.view({40, 16}));
  ASSERT_EQ(r.capacity, 1);
  auto dropped = (r.slot.select(1, 0) == r.capacity);
  const int64_t n_dropped = dropped.sum().item<int64_t>();
  EXPECT_GE(n_dropped, 36);  // at most 4 tokens (one per expert) are kept
  auto y = out.y.view({40, 16});
  EXPECT_EQ(y.index({dropped}).abs().max().item<float>(), 0.0f);
  EXPECT_GT(y.index({~dropped}).abs().min().item<float>(), 0.0f);
  // route() above counted a second forward of the same tokens.
  EXPECT_EQ(moe->statistics().forwards, 2);
  EXPECT_NEAR(moe->statistics().dropped_fraction(), static_cast<double>(n_dropped) / 40.0, 1e-12);
  y.sum().backward();  // a dropped token reaches y neither through an expert nor through its (zero) gate
  auto gx = x.grad().view({40, 16});
  EXPECT_EQ(gx.index({dropped}).abs().max().item<float>(), 0.0f);
  EXPECT_GT(gx.index({~dropped}).abs().max().item<float>(), 0.0f);
}

TEST(MoE, AuxLossOnHandBuiltRouter) {
  ModelOptions o = moe_options(1, 2.0);
  o.n_embd = 2;
  o.n_head = 1;
  o.moe_experts = 2;
  o.moe_aux_loss_coef = 0.01;
  o.moe_z_loss_coef = 0.001;
  MoE moe = make_moe(o);
  {
    torch::NoGradGuard no_grad;
    moe->router->weight.copy_(torch::tensor({{2.0f, 0.0f}, {0.0f, 1.0f}}));
  }
  // Tokens [1,0], [0,1], [1,0]: logits [2,0], [0,1], [2,0]; top-1 experts 0, 1, 0.
  auto r = moe->route(torch::tensor({{1.0f, 0.0f}, {0.0f, 1.0f}, {1.0f, 0.0f}}));
  const double s2 = 1 / (1 + std::exp(-2.0)), s1 = 1 / (1 + std::exp(-1.0));
  const double P0 = (s2 + (1 - s1) + s2) / 3, P1 = 1 - P0;
  const double f0 = 2.0 / 3, f1 = 1.0 / 3;
  const double balance = 0.01 * 2 * (f0 * P0 + f1 * P1);
  const double lse_a = std::log(std::exp(2.0) + 1), lse_b = std::log(1 + std::exp(1.0));
  const double z = 0.001 * (2 * lse_a * lse_a + lse_b * lse_b) / 3;
  EXPECT_NEAR(r.aux_loss.item<double>(), balance + z, 1e-7);
  EXPECT_TRUE(torch::equal(r.expert.squeeze(1), torch::tensor({0, 1, 0}, torch::kLong)));
  EXPECT_NEAR(r.gate[0][0].item<double>(), s2, 1e-6);  // top-1 gate is the raw probability
}

TEST(MoE, UniformRouterGivesAuxEqualToCoefficient) {
  // Switch: the balance term equals α when router probabilities are uniform; the z-loss is (log E)^2.
  ModelOptions o = moe_options(2, 4.0);  // capacity 24: nothing dropped
  MoE moe = make_moe(o);
  {
    torch::NoGradGuard no_grad;
    moe->router->weight.zero_();
  }
  auto r = moe->route(torch::randn({12, 16}));
  const double expected = o.moe_aux_loss_coef + o.moe_z_loss_coef * std::pow(std::log(4.0), 2);
  EXPECT_NEAR(r.aux_loss.item<double>(), expected, 1e-7);
  EXPECT_TRUE(test::all_close(r.gate.sum(1), torch::ones({12}), 0, 1e-6));  // GShard gates renormalised
}

// The routed step is replaceable from outside (expert parallelism's hook): a step that sends the
// buffer through the experts it is given in two halves (experts 0-1 and 2-3, as an all-to-all
// would split them) and combines gives the default output and gradients; a second owner is
// refused.
TEST(MoE, RoutedStepFromOutsideMatchesTheDefault) {
  torch::manual_seed(3);
  ModelOptions o = moe_options(2, 1.25);
  o.bias = false;  // the step below narrows the expert weights only
  MoE moe = make_moe(o);
  const at::Tensor x = torch::randn({2, 6, 16}, torch::requires_grad());
  const MoEOutput plain = moe(x);
  const at::Tensor plain_grad = torch::autograd::grad({plain.y.sum()}, {moe->w_fc})[0];
  int calls = 0;
  moe->set_routed_step([&calls, &moe](const at::Tensor& tokens, const MoERouting& r, const MoEImpl::ExpertFn& experts) {
    ++calls;
    const at::Tensor buffer = moe->dispatch(tokens, r);
    const std::vector<int64_t>& sizes = r.sizes;
    // Each half through a layer holding only its two experts (what one ep rank would hold).
    const int64_t first_half = sizes[0] + sizes[1];
    std::vector<at::Tensor> out;
    for (int64_t h = 0; h < 2; ++h) {
      const at::Tensor saved_fc = moe->w_fc, saved_proj = moe->w_proj;
      moe->w_fc = saved_fc.narrow(0, 2 * h, 2);
      moe->w_proj = saved_proj.narrow(0, 2 * h, 2);
      out.push_back(experts(h == 0 ? buffer.narrow(0, 0, first_half) : buffer.narrow(0, first_half, buffer.size(0) - first_half),
                            {sizes[2 * h], sizes[2 * h + 1]}));
      moe->w_fc = saved_fc;
      moe->w_proj = saved_proj;
    }
    return moe->combine(at::cat(out, 0), r);
  });
  const MoEOutput stepped = moe(x);
  const at::Tensor stepped_grad = torch::autograd::grad({stepped.y.sum()}, {moe->w_fc})[0];
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(at::allclose(stepped.y, plain.y, 1e-6, 1e-6));
  EXPECT_TRUE(at::allclose(stepped_grad, plain_grad, 1e-6, 1e-6));
  EXPECT_TRUE(test::throws_naming(
      [&] {
        moe->set_routed_step([&moe](const at::Tensor& t, const MoERouting& r, const MoEImpl::ExpertFn& e) {
          return moe->combine(e(moe->dispatch(t, r), r.sizes), r);
        });
      },
      {"already installed"}));
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

// Dropless routing (capacity factor 0) keeps every choice, with any k and sigmoid scores; the
// statistics count a step's forwards once each, whatever activation checkpointing recomputes.
TEST(MoE, DroplessKeepsEveryChoiceAndRecomputationIsNotCountedTwice) {
  ModelOptions o = moe_options(3, 0.0);
  o.moe_score = "sigmoid";
  MoE moe = make_moe(o);
  auto x = torch::randn({40, 16});
  auto r = moe->route(x);
  EXPECT_EQ(r.capacity, r.assigned.max().item<int64_t>());
  EXPECT_TRUE((r.slot < r.capacity).all().item<bool>());
  EXPECT_TRUE(torch::allclose(r.gate.sum(1), torch::ones({40})));  // k > 1: normalised
  EXPECT_EQ(moe->statistics().dropped_fraction(), 0.0);
  for (int64_t width : {16, 6}) {  // 6 x 4 bytes: not a 16-byte stride, one matmul pair per expert
    SCOPED_TRACE("n_embd " + std::to_string(width));
    ModelOptions wide = moe_options(2, 0.0);
    wide.n_embd = width;
    wide.mlp_ratio = 2;
    expect_expert_paths_agree(wide, [](MoEImpl& moe) { return moe.b_proj; });
  }

  ModelOptions m = moe_options(2, 1.0);
  m.n_layer = 2;
  m.vocab_size = 64;
  m.block_size = 16;
  torch::manual_seed(3);
  TransformerLM model(m);
  const at::Tensor idx = torch::randint(64, {2, 16});
  for (const std::string mode : {"none", "full"}) {
    model->set_activation_checkpointing(mode);
    for (int64_t l : model->layers()) model->block(l)->moe->reset_statistics();
    model->forward(idx, idx).loss.backward();
    for (int64_t l : model->layers()) {
      const MoEStatistics& s = model->block(l)->moe->statistics();
      EXPECT_EQ(s.forwards, 1) << mode << " layer " << l;
      EXPECT_EQ(s.tokens, 32) << mode << " layer " << l;
      EXPECT_EQ(s.assigned.sum().item<int64_t>(), 64) << mode << " layer " << l;
    }
  }
}

// Aux-loss-free balancing: the bias moves by rate * sign(mean - load) and steers the choice only;
// the gate is the chosen expert's score.
TEST(MoE, SelectionBiasSteersTheChoiceButNotTheGate) {
  MoE moe = make_moe(moe_options(1, 0.0));
  moe->update_selection_bias({10, 2, 4, 0}, 0.5);  // mean 4: over, under, even, under
  EXPECT_TRUE(torch::equal(moe->selection_bias(), torch::tensor({-0.5f, 0.5f, 0.0f, 0.5f})));
  moe->set_selection_bias(torch::tensor({0.0f, 0.0f, 0.0f, 10.0f}));
  auto x = torch::randn({40, 16});
  auto r = moe->route(x);
  EXPECT_TRUE((r.expert == 3).all().item<bool>());
  const at::Tensor scores = at::softmax(at::matmul(x, moe->router->weight.t()), -1);
  EXPECT_TRUE(torch::allclose(r.gate.squeeze(1), scores.select(1, 3)));
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

// SwiGLU experts of their own width, gates that are the chosen scores scaled (DeepSeekMoE's, with
// V3's routed scale) and a shared expert, against the formula of moe.h written out token by token;
// the three expert paths (grouped GEMM over dropless runs, the padded batched matmul, one matmul
// pair per expert where strides do not allow the grouped GEMM) agree on the GLU too.
TEST(MoE, SwiGLUExpertsScaledGatesAndASharedExpertFollowTheirFormula) {
  torch::manual_seed(5);
  ModelOptions o = moe_options(2, 0.0);
  o.mlp = "swiglu";
  o.bias = false;
  o.moe_ffn_hidden = 8;
  o.moe_shared_experts = 1;
  o.moe_gates = "scores";
  o.moe_routed_scale = 2.5;
  MoE moe = make_moe(o);
  ASSERT_EQ(moe->w_fc.sizes(), (std::vector<int64_t>{4, 16, 16}));
  ASSERT_EQ(moe->shared->c_fc->weight.sizes(), (std::vector<int64_t>{16, 16}));
  const at::Tensor x = torch::randn({10, 16});
  const at::Tensor y = moe(x.unsqueeze(0)).y.squeeze(0);

  auto glu = [](const at::Tensor& h) { return h.narrow(-1, 0, 8) * at::silu(h.narrow(-1, 8, 8)); };
  const auto [top_p, top_e] = at::softmax(at::matmul(x, moe->router->weight.t()), -1).topk(2, -1);
  at::Tensor expected = at::matmul(glu(at::matmul(x, moe->shared->c_fc->weight.t())), moe->shared->c_proj->weight.t());
  for (int64_t n = 0; n < 10; ++n)
    for (int64_t j = 0; j < 2; ++j) {
      const int64_t e = top_e[n][j].item<int64_t>();
      expected[n] += 2.5 * top_p[n][j] * at::matmul(glu(at::matmul(x[n], moe->w_fc[e])), moe->w_proj[e]);
    }
  EXPECT_TRUE(torch::allclose(y, expected, 1e-5, 1e-6)) << (y - expected).abs().max();

  for (int64_t width : {16, 6}) {
    SCOPED_TRACE("n_embd " + std::to_string(width));
    ModelOptions wide = o;
    wide.n_embd = width;
    wide.moe_ffn_hidden = width == 16 ? 8 : 6;
    expect_expert_paths_agree(wide, [](MoEImpl& moe) { return moe.shared->c_fc->weight; });
  }
}

}  // namespace
}  // namespace tessera
