// TransformerLM against the independent PyTorch implementation of tests/golden/golden_model.py:
// logits, losses and every parameter gradient for GPT, linear (two chunk sizes, one not dividing T),
// MoE top-1 / top-2 and linear + MoE models.
//
// Tolerances (float32): rtol 1e-4, atol 1e-5 for logits and losses. Gradients use atol 2e-5:
// the C++ side uses SDPA and chunked lightning attention, the Python side an explicit softmax and
// the quadratic decay form, so sums run in different orders (observed differences ~1e-6).
#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include "core/error.h"
#include "model/transformer.h"
#include "test_util.h"
#include "model/model_size.h"

namespace tessera {
namespace {

ModelOptions options_from(const std::map<std::string, std::string>& meta) {
  ModelOptions o;
  auto i = [&](const char* k) { return std::stoll(meta.at(k)); };
  auto d = [&](const char* k) { return std::stod(meta.at(k)); };
  o.arch = meta.at("arch");
  o.ffn = meta.at("ffn");
  o.bias = meta.at("bias") == "True";
  o.vocab_size = i("vocab_size");
  o.vocab_multiple = 1;  // the PyTorch reference has exactly vocab_size rows
  o.n_layer = i("n_layer");
  o.n_head = i("n_head");
  o.n_embd = i("n_embd");
  o.block_size = i("block_size");
  o.moe_experts = i("moe_experts");
  o.moe_top_k = i("moe_top_k");
  o.moe_every = i("moe_every");
  o.linear_chunk = i("linear_chunk");
  o.mlp_ratio = i("mlp_ratio");
  o.moe_capacity_factor = d("moe_capacity_factor");
  o.moe_aux_loss_coef = d("moe_aux_loss_coef");
  o.moe_z_loss_coef = d("moe_z_loss_coef");
  return o;
}

class ModelGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(ModelGolden, LogitsLossAndGradientsMatchPyTorch) {
  auto g = test::golden("model_" + GetParam() + ".safetensors");
  auto opts = options_from(g.metadata);
  TransformerLM model(opts);
  {
    torch::NoGradGuard no_grad;
    for (auto& p : model->named_parameters()) {
      ASSERT_TRUE(g.tensors.count(p.key())) << "golden lacks " << p.key();
      ASSERT_EQ(p.value().sizes(), g.tensors.at(p.key()).sizes()) << p.key();
      p.value().copy_(g.tensors.at(p.key()));
    }
  }
  size_t golden_params = 0;
  for (const auto& [name, t] : g.tensors)
    if (name.rfind("grad.", 0) == 0) ++golden_params;
  EXPECT_EQ(golden_params, model->parameters().size());
  EXPECT_EQ(parameter_count(opts), [&] {
    int64_t n = 0;
    for (const auto& p : model->parameters()) n += p.numel();
    return n;
  }());

  auto out = model->forward(g.tensors.at("idx"), g.tensors.at("targets"));
  EXPECT_TRUE(test::all_close(out.logits, g.tensors.at("logits"), 1e-4, 1e-5));
  EXPECT_TRUE(test::all_close(out.loss.reshape(1), g.tensors.at("loss"), 1e-4, 1e-5));
  EXPECT_TRUE(test::all_close(out.ce_loss.reshape(1), g.tensors.at("ce_loss"), 1e-4, 1e-5));
  EXPECT_TRUE(test::all_close(out.aux_loss.reshape(1), g.tensors.at("aux_loss"), 1e-4, 1e-6));
  out.loss.backward();
  for (auto& p : model->named_parameters()) {
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    EXPECT_TRUE(test::all_close(p.value().grad(), g.tensors.at("grad." + p.key()), 1e-4, 2e-5)) << p.key();
  }
  for (int64_t l = 0; l < opts.n_layer; ++l) {
    auto block = model->block(l);
    if (!block->moe) continue;
    EXPECT_TRUE(torch::equal(block->moe->statistics().kept, g.tensors.at("kept." + std::to_string(l))))
        << "layer " << l << ": " << block->moe->statistics().kept;
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, ModelGolden,
                         ::testing::Values("gpt", "linear", "linear_chunk5", "moe_top1", "moe_top2", "linear_moe"));

TEST(TransformerLM, WithoutTargetsReturnsLogitsOnly) {
  ModelOptions o = ModelOptions::from_preset("tiny_gpt");
  o.n_layer = 1;
  TransformerLM model(o);
  auto out = model->forward(torch::randint(0, o.vocab_size, {2, 5}), {});
  EXPECT_EQ(out.logits.sizes(), (std::vector<int64_t>{2, 5, o.vocab_size}));
  EXPECT_FALSE(out.loss.defined());
  EXPECT_FALSE(out.ce_loss.defined());
  EXPECT_EQ(out.aux_loss.item<float>(), 0.0f);
}

TEST(TransformerLM, RejectsSequencesLongerThanBlockSize) {
  ModelOptions o;
  o.n_layer = 1;
  o.block_size = 8;
  TransformerLM model(o);
  try {
    model->forward(torch::zeros({1, 9}, torch::kLong), {});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.block_size = 8"), std::string::npos) << e.what();
  }
}

TEST(TransformerLM, InitialisationFollowsGpt2) {
  ModelOptions o;
  o.n_layer = 8;
  o.n_embd = 256;
  o.n_head = 4;
  TransformerLM model(o);
  auto params = model->named_parameters();
  EXPECT_NEAR(params["wte.weight"].std().item<double>(), 0.02, 0.002);
  EXPECT_NEAR(params["h.0.attn.c_attn.weight"].std().item<double>(), 0.02, 0.002);
  EXPECT_NEAR(params["h.0.attn.c_proj.weight"].std().item<double>(), 0.02 / std::sqrt(16.0), 0.0005);
  EXPECT_NEAR(params["h.0.mlp.c_proj.weight"].std().item<double>(), 0.02 / std::sqrt(16.0), 0.0005);
  EXPECT_EQ(params["h.0.attn.c_attn.bias"].abs().max().item<float>(), 0.0f);
  EXPECT_EQ(params["ln_f.weight"].min().item<float>(), 1.0f);
  EXPECT_FALSE(params.contains("lm_head.weight"));
}

}  // namespace
}  // namespace tessera
