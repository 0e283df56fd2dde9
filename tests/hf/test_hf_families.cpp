// The Llama family against transformers, the implementation no one here wrote: each family's small
// random model (tests/hf/make_family_references.py: Llama with grouped-query attention, Llama 3.1's
// rope scaling and an untied head; Qwen 3 with q/k norms, a head width of its own and a tied head;
// Qwen 2 with q, k, v biases and multi-query attention; Mistral; Qwen 3 MoE's dense first block
// and top-2 of 4 experts; Qwen2-MoE's gated shared expert; Mixtral's top-2 of 4 SwiGLU experts, dropless with renormalized gates) is read by tessera's importer
// (model/hf_llama.h), and tessera's float32 logits, loss and every parameter's gradient on the same
// tokens equal transformers'. A wrong rotation, norm, head grouping or weight mapping moves the
// logits far beyond the tolerance.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <torch/types.h>
#include <torch/utils.h>

#include "checkpoint/safetensors.h"
#include "core/json_file.h"
#include "model/hf_llama.h"
#include "model/hf_names.h"
#include "model/moe.h"
#include "model/transformer.h"

namespace tessera::test {
namespace {

namespace fs = std::filesystem;

// max |a - b| / max |b|
double relative_error(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>() /
         std::max(b.to(at::kDouble).abs().max().item<double>(), 1e-30);
}

// Every [model] key's value, as text.
struct FieldText {
  std::map<std::string, std::string> out;
  template <class T, class... Rest>
  void operator()(const char* key, T& value, const char*, Rest&&...) {
    std::ostringstream text;
    text << value;
    out[key] = text.str();
  }
};

std::map<std::string, std::string> fields(ModelOptions o) {
  FieldText collect;
  o.visit(collect);
  return collect.out;
}

class HfFamily : public ::testing::TestWithParam<std::string> {};

TEST_P(HfFamily, LogitsLossAndEveryGradientEqualTransformers) {
  const fs::path dir = fs::path(TESSERA_HF_FAMILIES) / GetParam();
  if (!fs::exists(dir / "reference.safetensors"))
    GTEST_SKIP() << dir << " has no reference: tests/hf/make_family_references.py did not run (transformers missing?)";
  ModelOptions o = llama_family_options_from_hf_config(read_json_file((dir / "config.json").string()),
                                                       ModelOptions{}, (dir / "config.json").string());
  o.moe_aux_loss_coef = 0;  // transformers leaves Mixtral's balance loss out without output_router_logits
  TransformerLM model(o);
  import_state(*model, read_hf_llama_weights(dir.string(), o), dir.string());
  const auto reference = read_safetensors((dir / "reference.safetensors").string()).tensors;

  const ModelOutput out = model->forward(reference.at("tokens"), reference.at("targets"));
  const at::Tensor logits = out.logits.narrow(-1, 0, o.vocab_size);
  EXPECT_LT(relative_error(logits, reference.at("logits")), 2e-5) << GetParam() << ": logits";
  EXPECT_NEAR(out.loss.item<double>(), reference.at("loss").item<double>(), 1e-5) << GetParam() << ": loss";
  out.loss.backward();

  const auto grads = read_hf_llama_weights((dir / "grads").string(), o);
  int64_t compared = 0;
  for (const auto& item : model->named_parameters()) {
    const std::string name = export_name(o, item.key());
    ASSERT_TRUE(grads.count(name)) << name;
    at::Tensor grad = item.value().grad();
    if (item.key() == "wte.weight") grad = grad.narrow(0, 0, o.vocab_size);
    ASSERT_TRUE(grad.defined()) << name;
    EXPECT_LT(relative_error(grad, grads.at(name)), 5e-5) << GetParam() << ": gradient of " << name;
    ++compared;
  }
  EXPECT_EQ(compared, static_cast<int64_t>(grads.size()));
}

// Export is the inverse of import: the imported model's tensors written under transformers' names
// (hf_llama_family_weights) are the folder's, bit for bit, and its config (hf_llama_family_config)
// reads back as the same model.
TEST_P(HfFamily, ExportWritesBackTheFolderItImported) {
  const fs::path dir = fs::path(TESSERA_HF_FAMILIES) / GetParam();
  if (!fs::exists(dir / "model.safetensors"))
    GTEST_SKIP() << dir << " has no model: tests/hf/make_family_references.py did not run (transformers missing?)";
  const ModelOptions o = llama_family_options_from_hf_config(read_json_file((dir / "config.json").string()),
                                                             ModelOptions{}, (dir / "config.json").string());
  TransformerLM model(o);
  import_state(*model, read_hf_llama_weights(dir.string(), o), dir.string());
  std::map<std::string, at::Tensor> ours;
  for (auto& [name, t] : export_state(*model)) ours.emplace(name, t);
  const auto exported = hf_llama_family_weights(o, ours);
  const auto stored = read_safetensors((dir / "model.safetensors").string()).tensors;
  ASSERT_EQ(exported.size(), stored.size()) << GetParam();
  for (const auto& [name, t] : stored) {
    ASSERT_TRUE(exported.count(name)) << GetParam() << ": " << name;
    EXPECT_TRUE(at::equal(exported.at(name), t)) << GetParam() << ": " << name;
  }
  const ModelOptions back = llama_family_options_from_hf_config(hf_llama_family_config(o), ModelOptions{}, "exported");
  EXPECT_EQ(fields(back), fields(o)) << GetParam();
}

INSTANTIATE_TEST_SUITE_P(Families, HfFamily, ::testing::Values("llama", "qwen3", "qwen2", "mistral", "qwen3_moe", "qwen2_moe", "mixtral"),
                         [](const auto& info) { return info.param; });

// Mixtral's experts as transformers 5 holds them (stacked: gate_up_proj, down_proj, the router as
// mlp.gate) read as the same tensors as the per-expert files save_pretrained writes.
TEST(HfMixtral, StackedExpertsReadAsThePerExpertFiles) {
  const fs::path dir = fs::path(TESSERA_HF_FAMILIES) / "mixtral";
  if (!fs::exists(dir / "stacked" / "model.safetensors"))
    GTEST_SKIP() << dir << " has no stacked weights: tests/hf/make_family_references.py did not run";
  const ModelOptions o = llama_family_options_from_hf_config(read_json_file((dir / "config.json").string()),
                                                             ModelOptions{}, (dir / "config.json").string());
  const auto per_expert = read_hf_llama_weights(dir.string(), o);
  const auto stacked = read_hf_llama_weights((dir / "stacked").string(), o);
  ASSERT_EQ(per_expert.size(), stacked.size());
  for (const auto& [name, t] : per_expert) {
    ASSERT_TRUE(stacked.count(name)) << name;
    EXPECT_TRUE(at::equal(stacked.at(name), t)) << name;
  }
  EXPECT_EQ(per_expert.at("model.h.0.moe.w_fc").sizes(), (std::vector<int64_t>{4, 64, 192}));
}

// A Qwen 3 MoE config whose dense blocks are not the first ones is refused by key, and one that is
// reads as tessera's options (transformers 5's num_local_experts and the Hub's num_experts alike).
TEST(HfQwen3Moe, DenseBlocksOnlyFirstAndBothExpertKeys) {
  nlohmann::json config = {{"model_type", "qwen3_moe"}, {"vocab_size", 256}, {"hidden_size", 64},
                           {"intermediate_size", 96}, {"num_hidden_layers", 4}, {"num_attention_heads", 4},
                           {"num_key_value_heads", 2}, {"head_dim", 16}, {"max_position_embeddings", 128},
                           {"hidden_act", "silu"}, {"num_experts", 8}, {"num_experts_per_tok", 2},
                           {"moe_intermediate_size", 32}, {"norm_topk_prob", false}, {"decoder_sparse_step", 1},
                           {"mlp_only_layers", {0, 1}}};
  ModelOptions o = llama_family_options_from_hf_config(config, ModelOptions{}, "c.json");
  EXPECT_EQ(o.moe_experts, 8);
  EXPECT_EQ(o.moe_dense_layers, 2);
  EXPECT_FALSE(o.renormalized_gates());
  EXPECT_TRUE(o.qk_norm && !o.is_moe_block(1) && o.is_moe_block(2));
  config.erase("num_experts");
  config["num_local_experts"] = 4;
  EXPECT_EQ(llama_family_options_from_hf_config(config, ModelOptions{}, "c.json").moe_experts, 4);
  config["mlp_only_layers"] = {1};
  try {
    llama_family_options_from_hf_config(config, ModelOptions{}, "c.json");
    ADD_FAILURE() << "mlp_only_layers = [1] was accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("c.json: mlp_only_layers = [1] cannot be imported"), std::string::npos)
        << e.what();
  }
}

// DeepSeek-V3's group-limited routing (model.moe_groups, moe_topk_groups) chooses, for every token,
// the experts transformers' DeepseekV3TopkRouter chose, with the same weights: 16 experts in 4
// groups, the top 4 from the best 2 groups of sigmoid scores plus the correction bias, renormalized
// and scaled by 2.5. The reference must exercise the groups: on some tokens the plain top 4 reaches
// outside them.
TEST(HfDeepseekV3, GroupLimitedRoutingChoosesAsTransformers) {
  const fs::path file = fs::path(TESSERA_HF_FAMILIES) / "deepseek_v3_router" / "reference.safetensors";
  if (!fs::exists(file)) GTEST_SKIP() << file << " is missing: tests/hf/make_family_references.py did not run";
  const auto ref = read_safetensors(file.string()).tensors;
  ModelOptions o;
  o.n_embd = 64;
  o.ffn = "moe";
  o.moe_experts = 16;
  o.moe_top_k = 4;
  o.moe_ffn_hidden = 32;
  o.moe_score = "sigmoid";
  o.moe_gates = "renormalized";
  o.moe_routed_scale = 2.5;
  o.moe_capacity_factor = 0;
  o.moe_groups = 4;
  o.moe_topk_groups = 2;
  MoE moe(o, at::TensorOptions());
  {
    torch::NoGradGuard no_grad;
    moe->router->weight.copy_(ref.at("weight"));
  }
  moe->set_selection_bias(ref.at("bias"));
  const MoERouting r = moe->route(ref.at("hidden"));
  // Each token's experts in ascending order, their gates alongside (transformers' are unsorted).
  const auto ascending = [](const at::Tensor& experts, const at::Tensor& gates) {
    const auto [sorted, order] = experts.sort(-1);
    return std::make_pair(sorted, gates.gather(1, order));
  };
  const auto [ours, our_gates] = ascending(r.expert, r.gate);
  const auto [theirs, their_gates] = ascending(ref.at("experts"), ref.at("weights"));
  EXPECT_TRUE(ours.equal(theirs));
  EXPECT_LT(relative_error(our_gates, their_gates), 1e-6);
  const at::Tensor selection = at::sigmoid(at::matmul(ref.at("hidden"), ref.at("weight").t())) + ref.at("bias");
  const at::Tensor plain = std::get<0>(std::get<1>(selection.topk(4, -1)).sort(-1));
  EXPECT_GT(plain.ne(theirs).any(-1).sum().item<int64_t>(), 0) << "the reference never needed the groups";
}

}  // namespace
}  // namespace tessera::test
