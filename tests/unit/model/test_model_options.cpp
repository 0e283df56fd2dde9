// ModelOptions: presets (shapes, unknown-name error), checks naming model.<key>, parameter_count
// against real modules (every cheap preset and several variants) and against the published
// GPT-2 124M count, and flops_per_token against its formula.
#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include "core/error.h"
#include "model/transformer.h"
#include "model/model_size.h"

namespace tessera {
namespace {

int64_t real_count(const ModelOptions& o) {
  TransformerLM model(o);
  int64_t n = 0;
  for (const auto& p : model->parameters()) n += p.numel();
  return n;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ModelOptions, ParameterCountEqualsModuleForTinyPresetsAndVariants) {
  for (const char* name : {"tiny_gpt", "tiny_linear", "tiny_moe"}) {
    auto o = ModelOptions::from_preset(name);
    EXPECT_EQ(parameter_count(o), real_count(o)) << name;
    o.bias = false;
    EXPECT_EQ(parameter_count(o), real_count(o)) << name << " without bias";
    o.ffn = "moe";
    o.moe_every = 2;
    o.moe_experts = 3;
    EXPECT_EQ(parameter_count(o), real_count(o)) << name << " moe_every 2";
  }
}

// Without padding, Hugging Face's gpt2 count; with model.vocab_multiple = 128 (the default) the
// embedding holds 50304 rows: 47 x 768 more.
TEST(ModelOptions, Gpt2SmallHasPublishedParameterCount) {
  ModelOptions o = ModelOptions::from_preset("gpt2_124m");
  EXPECT_EQ(o.padded_vocab(), 50304);
  EXPECT_EQ(parameter_count(o), 124439808 + 47 * 768);
  o.vocab_multiple = 1;
  EXPECT_EQ(parameter_count(o), 124439808);
}

TEST(ModelOptions, PresetShapes) {
  auto g = ModelOptions::from_preset("gpt2_1558m");
  EXPECT_EQ(g.n_layer, 48);
  EXPECT_EQ(g.n_embd, 1600);
  EXPECT_EQ(g.n_head, 25);
  EXPECT_EQ(g.vocab_size, 50257);
  EXPECT_EQ(g.block_size, 1024);
  auto big = ModelOptions::from_preset("gpt3_175b");
  EXPECT_EQ(big.n_layer, 96);
  EXPECT_EQ(big.n_embd, 12288);
  EXPECT_EQ(big.block_size, 2048);
  // 174.6B with the 50257-token tied embedding and 2048 positions (the paper rounds to 175B).
  big.vocab_multiple = 1;
  EXPECT_EQ(parameter_count(big), 174604259328);
  EXPECT_EQ(ModelOptions::from_preset("tiny_moe").moe_top_k, 2);
  EXPECT_EQ(ModelOptions::from_preset("tiny_linear").arch, "linear");
  for (const auto& name : ModelOptions::preset_names()) {
    auto o = ModelOptions::from_preset(name);
    EXPECT_EQ(o.preset, name);
    EXPECT_NO_THROW(o.check("test")) << name;
  }
  EXPECT_EQ(ModelOptions::preset_names().size(), 26u);
}

// The Llama 3.1 and Qwen 3 presets hold their published parameter counts exactly (Meta's model
// cards round them: 8.03B, 70.6B, 405B; transformers' models of the same config.json, counted on
// the meta device, give these numbers), and their block kinds.
TEST(ModelOptions, LlamaAndQwenPresetsHaveTheirPublishedParameterCounts) {
  EXPECT_EQ(parameter_count(ModelOptions::from_preset("llama3_8b")), 8030261248);
  EXPECT_EQ(parameter_count(ModelOptions::from_preset("llama3_70b")), 70553706496);
  EXPECT_EQ(parameter_count(ModelOptions::from_preset("llama3_405b")), 405853388800);
  EXPECT_EQ(parameter_count(ModelOptions::from_preset("qwen3_0.6b")), 596049920);
  const ModelOptions llama = ModelOptions::from_preset("llama3_8b");
  EXPECT_TRUE(llama.rms_norm() && llama.rotary() && llama.swiglu() && !llama.tie_embeddings && !llama.fused_qkv());
  EXPECT_EQ(llama.kv_heads(), 8);
  EXPECT_EQ(llama.head_width(), 128);
  const ModelOptions qwen = ModelOptions::from_preset("qwen3_0.6b");
  EXPECT_TRUE(qwen.qk_norm && qwen.tie_embeddings);
  EXPECT_EQ(qwen.head_width() * qwen.n_head, 2048);  // wider than n_embd = 1024
  // GPT-2 keeps its layout under "auto".
  const ModelOptions gpt = ModelOptions::from_preset("gpt2_124m");
  EXPECT_TRUE(!gpt.rms_norm() && gpt.learned_positions() && !gpt.swiglu() && gpt.fused_qkv());
}

// Mixtral 8x7B's count is transformers' MixtralForCausalLM of its config.json on the meta device
// (Mistral's card: 46.7B); DeepSeekMoE 16B's is its config.json counted by hand (its card: 16.4B;
// transformers has no model of it): embeddings 2 x 102400 x 2048, 28 attention blocks of 4 x 2048^2,
// a dense first MLP of 3 x 2048 x 10944, and 27 MoE blocks of 64 routed and 2 shared experts of
// 3 x 2048 x 1408 with a 64 x 2048 router, norms 57 x 2048.
TEST(ModelOptions, MoEPresetsHaveTheirPublishedParameterCounts) {
  EXPECT_EQ(parameter_count(ModelOptions::from_preset("mixtral_8x7b")), 46702792704);
  EXPECT_EQ(parameter_count(ModelOptions::from_preset("deepseek_moe_16b")), 16375728128);
  // transformers' Qwen3MoeForCausalLM of Qwen3-30B-A3B's config.json on the meta device.
  EXPECT_EQ(parameter_count(ModelOptions::from_preset("qwen3_30b_a3b")), 30532122624);
  const ModelOptions mixtral = ModelOptions::from_preset("mixtral_8x7b");
  EXPECT_TRUE(mixtral.swiglu() && mixtral.renormalized_gates() && mixtral.is_moe_block(0));
  EXPECT_EQ(mixtral.expert_hidden(), 14336);
  const ModelOptions deepseek = ModelOptions::from_preset("deepseek_moe_16b");
  EXPECT_FALSE(deepseek.is_moe_block(0));
  EXPECT_TRUE(deepseek.is_moe_block(1) && deepseek.is_moe_block(27));
  EXPECT_FALSE(deepseek.renormalized_gates());
  EXPECT_EQ(deepseek.expert_hidden(), 1408);
  EXPECT_EQ(deepseek.hidden(), 10944);
}

TEST(ModelOptions, BlockKindsThatCannotBuildAreRefusedNamingTheKeys) {
  auto refused = [](const std::function<void(ModelOptions&)>& change, const std::string& needle) {
    ModelOptions o = ModelOptions::from_preset("tiny_llama");
    change(o);
    const std::string msg = error_of([&] { o.check("cfg"); });
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
  };
  refused([](ModelOptions& o) { o.n_kv_head = 3; }, "model.n_kv_head = 3 must divide model.n_head = 4");
  refused([](ModelOptions& o) { o.position = "alibi"; }, "model.position must be one of");
  refused([](ModelOptions& o) { o.head_dim = 33; }, "needs an even head width (got 33)");
  refused([](ModelOptions& o) { o.position = "learned"; o.rope_scaling = "llama3"; }, "needs model.position = rope");
  refused([](ModelOptions& o) { o.arch = "linear"; }, "model.arch = linear (lightning attention) takes none of");
  refused([](ModelOptions& o) { o.moe_gates = "softmax"; }, "model.moe_gates must be one of auto, renormalized, scores");
  refused([](ModelOptions& o) { o.ffn = "moe"; o.moe_dense_layers = 3; o.moe_every = 3; },
          "model.moe_dense_layers = 3 with model.moe_every = 3 leaves no MoE block among model.n_layer = 4");
  refused([](ModelOptions& o) { o.moe_experts = 8; o.moe_groups = 3; },
          "model.moe_groups = 3 must divide model.moe_experts = 8 into groups of at least 2 experts");
  refused([](ModelOptions& o) { o.moe_experts = 8; o.moe_groups = 8; },
          "model.moe_groups = 8 must divide model.moe_experts = 8 into groups of at least 2 experts");
  refused([](ModelOptions& o) { o.moe_experts = 8; o.moe_groups = 4; o.moe_topk_groups = 5; },
          "model.moe_topk_groups = 5 must be at most model.moe_groups = 4");
  refused([](ModelOptions& o) { o.moe_experts = 8; o.moe_top_k = 3; o.moe_groups = 4; o.moe_topk_groups = 1; },
          "model.moe_top_k = 3 exceeds the 2 experts of model.moe_topk_groups = 1 groups of 2");
  refused([](ModelOptions& o) { o.moe_shared_gate = true; },
          "model.moe_shared_gate = true needs shared experts (model.moe_shared_experts > 0)");
}

TEST(ModelOptions, UnknownPresetListsKnownOnes) {
  auto msg = error_of([] { ModelOptions::from_preset("gpt5"); });
  EXPECT_NE(msg.find("unknown model preset 'gpt5' (model.preset); known: "), std::string::npos) << msg;
  EXPECT_NE(msg.find("tiny_gpt"), std::string::npos) << msg;
  EXPECT_NE(msg.find("gpt3_1.3b"), std::string::npos) << msg;
}

TEST(ModelOptions, ChecksNameTheKey) {
  auto expect_key = [](const std::function<void(ModelOptions&)>& edit, const std::string& key) {
    ModelOptions o;
    edit(o);
    auto msg = error_of([&] { o.check("cfg.toml"); });
    EXPECT_NE(msg.find("cfg.toml: "), std::string::npos) << msg;
    EXPECT_NE(msg.find(key), std::string::npos) << msg;
  };
  expect_key([](ModelOptions& o) { o.n_embd = 130; }, "model.n_embd");
  expect_key([](ModelOptions& o) { o.arch = "rnn"; }, "model.arch");
  expect_key([](ModelOptions& o) { o.ffn = "sparse"; }, "model.ffn");
  expect_key([](ModelOptions& o) { o.moe_top_k = 5; }, "model.moe_top_k");  // of 4 experts
  expect_key([](ModelOptions& o) { o.moe_score = "tanh"; }, "model.moe_score");
  expect_key([](ModelOptions& o) { o.moe_aux_scope = "batch"; }, "model.moe_aux_scope");
  expect_key([](ModelOptions& o) { o.moe_experts = 1; o.moe_top_k = 2; }, "model.moe_top_k");
  expect_key([](ModelOptions& o) { o.dropout = 1.0; }, "model.dropout");
  expect_key([](ModelOptions& o) { o.linear_chunk = 0; }, "model.linear_chunk");
  expect_key([](ModelOptions& o) { o.moe_capacity_factor = -1; }, "model.moe_capacity_factor");
  expect_key([](ModelOptions& o) { o.preset = "nope"; }, "model.preset");
  EXPECT_NO_THROW(ModelOptions().check("cfg.toml"));
}

TEST(ModelOptions, FlopsPerToken) {
  auto o = ModelOptions::from_preset("gpt2_124m");
  const double n = 124475904.0 - 1024.0 * 768.0;  // without wpe, with the padded rows the head computes
  EXPECT_DOUBLE_EQ(flops_per_token(o, 1024), 6 * n + 6.0 * 12 * 768 * 1024);
  auto lin = ModelOptions::from_preset("tiny_linear");
  const double nl = static_cast<double>(parameter_count(lin));  // no wpe in arch linear
  EXPECT_DOUBLE_EQ(flops_per_token(lin, 128), 6 * nl + 6.0 * 4 * 128 * 64 + 12.0 * 4 * 128 * 32);
  auto moe = ModelOptions::from_preset("tiny_moe");
  auto dense = ModelOptions::from_preset("tiny_gpt");
  // top-2 of 4 experts: active FFN = 2 experts + router.
  const double per_expert = 2.0 * 128 * 512 + 512 + 128;
  const double delta = 4 * (2 * per_expert + 128 * 4 - per_expert);
  EXPECT_DOUBLE_EQ(flops_per_token(moe, 100) - flops_per_token(dense, 100), 6 * delta);
}

}  // namespace
}  // namespace tessera
