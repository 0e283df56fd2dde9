// Export naming: GPT-2 layout models use Hugging Face GPT2LMHeadModel names with Conv1D weights
// transposed; other models use "model." + internal names; import_state inverts export_state and
// refuses missing, unexpected and mis-shaped tensors naming the source and the tensor.
#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <filesystem>
#include <fstream>

#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "core/fs.h"
#include "model/hf_llama.h"
#include "model/hf_names.h"
#include "test_util.h"

namespace tessera {
namespace {

ModelOptions hf_tiny(const std::string& arch, const std::string& ffn) {
  ModelOptions o;
  o.arch = arch;
  o.ffn = ffn;
  o.vocab_size = 40;
  o.vocab_multiple = 1;
  o.n_layer = 2;
  o.n_head = 2;
  o.n_embd = 8;
  o.block_size = 16;
  return o;
}

std::map<std::string, at::Tensor> as_map(const NamedTensors& named) {
  return std::map<std::string, at::Tensor>(named.begin(), named.end());
}

TEST(HfNames, Gpt2NamesAndShapes) {
  TransformerLM model(hf_tiny("gpt", "dense"));
  auto state = as_map(export_state(*model));
  std::vector<std::pair<std::string, std::vector<int64_t>>> expected = {
      {"transformer.wte.weight", {40, 8}},          {"transformer.wpe.weight", {16, 8}},
      {"transformer.h.0.ln_1.weight", {8}},         {"transformer.h.0.ln_1.bias", {8}},
      {"transformer.h.0.attn.c_attn.weight", {8, 24}}, {"transformer.h.0.attn.c_attn.bias", {24}},
      {"transformer.h.0.attn.c_proj.weight", {8, 8}},  {"transformer.h.0.attn.c_proj.bias", {8}},
      {"transformer.h.1.ln_2.weight", {8}},         {"transformer.h.1.mlp.c_fc.weight", {8, 32}},
      {"transformer.h.1.mlp.c_fc.bias", {32}},      {"transformer.h.1.mlp.c_proj.weight", {32, 8}},
      {"transformer.h.1.mlp.c_proj.bias", {8}},     {"transformer.ln_f.weight", {8}},
      {"transformer.ln_f.bias", {8}}};
  for (const auto& [name, shape] : expected) {
    ASSERT_TRUE(state.count(name)) << name;
    EXPECT_EQ(state.at(name).sizes(), shape) << name;
  }
  EXPECT_EQ(state.size(), 4u + 2 * 12);  // wte, wpe, ln_f (2); 12 per block
  auto params = model->named_parameters();
  EXPECT_TRUE(torch::equal(state.at("transformer.h.0.attn.c_attn.weight"), params["h.0.attn.c_attn.weight"].t()));
}

TEST(HfNames, RoundTripThroughSafetensors) {
  for (const auto& [arch, ffn] : std::vector<std::pair<std::string, std::string>>{
           {"gpt", "dense"}, {"linear", "dense"}, {"gpt", "moe"}}) {
    torch::manual_seed(1);
    TransformerLM a(hf_tiny(arch, ffn));
    torch::manual_seed(2);
    TransformerLM b(hf_tiny(arch, ffn));
    auto path = test::golden_path("hf_names_roundtrip_" + arch + "_" + ffn + ".safetensors");
    write_safetensors(path, export_state(*a));
    import_state(*b, read_safetensors(path).tensors, path);
    auto pb = b->named_parameters();
    for (const auto& p : a->named_parameters()) EXPECT_TRUE(torch::equal(p.value(), pb[p.key()])) << p.key();
    if (arch != "gpt" || ffn != "dense") {
      EXPECT_EQ(export_state(*a).front().first.rfind("model.", 0), 0u);
    }
  }
}

std::string import_error(TransformerLMImpl& model, const std::map<std::string, at::Tensor>& tensors) {
  try {
    import_state(model, tensors, "ckpt.safetensors");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(HfNames, ImportRefusesBadTensorsByName) {
  TransformerLM model(hf_tiny("gpt", "dense"));
  auto state = as_map(export_state(*model));

  auto missing = state;
  missing.erase("transformer.h.1.mlp.c_fc.bias");
  auto msg = import_error(*model, missing);
  EXPECT_NE(msg.find("ckpt.safetensors: missing tensor 'transformer.h.1.mlp.c_fc.bias'"), std::string::npos) << msg;

  auto extra = state;
  extra["transformer.h.2.ln_1.weight"] = torch::ones({8});
  msg = import_error(*model, extra);
  EXPECT_NE(msg.find("ckpt.safetensors: unexpected tensor 'transformer.h.2.ln_1.weight'"), std::string::npos) << msg;

  auto wrong = state;
  wrong["transformer.wte.weight"] = torch::zeros({50, 8});
  msg = import_error(*model, wrong);
  EXPECT_NE(msg.find("tensor 'transformer.wte.weight' has shape [50, 8], the model expects [40, 8]"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("model.vocab_size = 40"), std::string::npos) << msg;
}

// `tessera import` reads a Llama-family folder part by part (model/hf_llama.h): the ends, each
// block, then the final norm, each read from its file when it is made. Here the folder is two
// files, block 1 and the norm in the second; once the first part is consumed the second file is cut
// short, so the read fails at block 1, naming that file, after block 0 came whole: nothing of the
// second file was read before its part.
TEST(HfLlamaParts, AreReadInOrderEachWhenItIsMade) {
  ModelOptions o = ModelOptions::from_preset("tiny_llama");
  o.n_layer = 2;
  ASSERT_EQ(hf_llama_family_refusal(o), "");
  TransformerLM model(o);
  std::map<std::string, at::Tensor> ours;
  for (auto& [name, t] : export_state(*model)) ours.emplace(name, t);
  const std::map<std::string, at::Tensor> hf = hf_llama_family_weights(o, ours);
  const std::string dir = test::fresh_dir("hf_llama_parts");
  NamedTensors first, second;
  nlohmann::json weight_map;
  for (const auto& [name, t] : hf) {
    const bool late = name.rfind("model.layers.1.", 0) == 0 || name == "model.norm.weight";
    (late ? second : first).emplace_back(name, t);
    weight_map[name] = late ? "model-00002-of-00002.safetensors" : "model-00001-of-00002.safetensors";
  }
  write_safetensors(dir + "/model-00001-of-00002.safetensors", first);
  write_safetensors(dir + "/model-00002-of-00002.safetensors", second);
  write_file_durable(dir + "/model.safetensors.index.json", nlohmann::json{{"weight_map", weight_map}}.dump());

  // Whole, the parts come in order and hold every tensor once.
  std::vector<std::vector<std::string>> parts;
  read_hf_llama_parts(dir, o, [&](std::map<std::string, at::Tensor> part) {
    parts.emplace_back();
    for (const auto& [name, t] : part) parts.back().push_back(name);
  });
  ASSERT_EQ(static_cast<int64_t>(parts.size()), hf_llama_part_count(o));
  EXPECT_EQ(parts.front(), (std::vector<std::string>{"model.lm_head.weight", "model.wte.weight"}));
  EXPECT_EQ(parts.back(), (std::vector<std::string>{"model.ln_f.weight"}));
  for (size_t l = 0; l < 2; ++l)
    for (const std::string& name : parts[1 + l]) EXPECT_EQ(name.rfind("model.h." + std::to_string(l) + ".", 0), 0u) << name;

  // Cut short after the first part: block 0 still comes, block 1 fails naming the second file.
  const std::string late = dir + "/model-00002-of-00002.safetensors";
  const auto size = std::filesystem::file_size(late);
  int64_t consumed = 0;
  try {
    read_hf_llama_parts(dir, o, [&](std::map<std::string, at::Tensor>) {
      if (consumed++ == 0) std::filesystem::resize_file(late, size / 2);
    });
    FAIL() << "a folder cut short was read";
  } catch (const Error& e) {
    EXPECT_EQ(consumed, 2) << "the ends and block 0 came before block 1 failed: " << e.what();
    EXPECT_NE(std::string(e.what()).find("model-00002-of-00002.safetensors"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tessera
