// ModelOptions: checks, presets, and the parameter and FLOP counts (model_options.h).
//
// Preset shapes: GPT-2 from the released checkpoints; GPT-3 from Brown et al. 2020 Table 2.1, with
// two typos of that table fixed so that n_embd = n_head * d_head: GPT-3 XL (1.3B) uses 16 heads of
// 128 (the table lists 24 heads of 128 at d_model 2048) and GPT-3 13B uses d_model 5120 = 40 * 128
// (the table lists 5140).
#include "model/model_options.h"

#include <algorithm>
#include <functional>
#include <map>
#include <sstream>

#include "core/error.h"

namespace tessera {
namespace {

ModelOptions shape(const std::string& name, int64_t vocab, int64_t block, int64_t layers, int64_t embd,
                   int64_t heads) {
  ModelOptions o;
  o.preset = name;
  o.vocab_size = vocab;
  o.block_size = block;
  o.n_layer = layers;
  o.n_embd = embd;
  o.n_head = heads;
  return o;
}

const std::map<std::string, std::function<ModelOptions()>>& presets() {
  static const std::map<std::string, std::function<ModelOptions()>> table = {
      {"tiny_gpt", [] { return shape("tiny_gpt", 256, 128, 4, 128, 4); }},
      {"tiny_linear",
       [] {
         auto o = shape("tiny_linear", 256, 128, 4, 128, 4);
         o.arch = "linear";
         return o;
       }},
      {"tiny_moe",
       [] {
         auto o = shape("tiny_moe", 256, 128, 4, 128, 4);
         o.ffn = "moe";
         o.moe_experts = 4;
         o.moe_top_k = 2;
         return o;
       }},
      {"gpt2_124m", [] { return shape("gpt2_124m", 50257, 1024, 12, 768, 12); }},
      {"gpt2_350m", [] { return shape("gpt2_350m", 50257, 1024, 24, 1024, 16); }},
      {"gpt2_774m", [] { return shape("gpt2_774m", 50257, 1024, 36, 1280, 20); }},
      {"gpt2_1558m", [] { return shape("gpt2_1558m", 50257, 1024, 48, 1600, 25); }},
      {"gpt3_125m", [] { return shape("gpt3_125m", 50257, 2048, 12, 768, 12); }},
      {"gpt3_350m", [] { return shape("gpt3_350m", 50257, 2048, 24, 1024, 16); }},
      {"gpt3_760m", [] { return shape("gpt3_760m", 50257, 2048, 24, 1536, 16); }},
      {"gpt3_1.3b", [] { return shape("gpt3_1.3b", 50257, 2048, 24, 2048, 16); }},
      {"gpt3_2.7b", [] { return shape("gpt3_2.7b", 50257, 2048, 32, 2560, 32); }},
      {"gpt3_6.7b", [] { return shape("gpt3_6.7b", 50257, 2048, 32, 4096, 32); }},
      {"gpt3_13b", [] { return shape("gpt3_13b", 50257, 2048, 40, 5120, 40); }},
      {"gpt3_175b", [] { return shape("gpt3_175b", 50257, 2048, 96, 12288, 96); }},
  };
  return table;
}

std::string known_presets() {
  std::ostringstream out;
  const char* sep = "";
  for (const auto& name : ModelOptions::preset_names()) {
    out << sep << name;
    sep = ", ";
  }
  return out.str();
}

}  // namespace

void ModelOptions::check(const std::string& source) const {
  check_ranges(*this, "model", source);
  if (!preset.empty() && !presets().count(preset))
    fail(source, ": unknown model preset '", preset, "' (model.preset); known: ", known_presets());
  require(arch == "gpt" || arch == "linear", source, ": model.arch must be gpt or linear (got '", arch, "')");
  require(ffn == "dense" || ffn == "moe", source, ": model.ffn must be dense or moe (got '", ffn, "')");
  require(moe_score == "softmax" || moe_score == "sigmoid", source,
          ": model.moe_score must be softmax or sigmoid (got '", moe_score, "')");
  require(moe_aux_scope == "micro_batch" || moe_aux_scope == "global", source,
          ": model.moe_aux_scope must be micro_batch or global (got '", moe_aux_scope, "')");
  require(n_embd % n_head == 0, source, ": model.n_embd must be a multiple of model.n_head (got n_embd ", n_embd,
          ", n_head ", n_head, ")");
  require(moe_top_k <= moe_experts, source, ": model.moe_top_k must be at most model.moe_experts (got top_k ",
          moe_top_k, ", experts ", moe_experts, ")");
  require(ffn != "moe" || moe_every <= n_layer, source, ": model.moe_every must be at most model.n_layer (got ",
          moe_every, ", n_layer ", n_layer, ")");
}

ModelOptions ModelOptions::from_preset(const std::string& name) {
  auto it = presets().find(name);
  if (it == presets().end()) fail("unknown model preset '", name, "' (model.preset); known: ", known_presets());
  return it->second();
}

std::vector<std::string> ModelOptions::preset_names() {
  std::vector<std::string> names;
  for (const auto& entry : presets()) names.push_back(entry.first);
  return names;
}

}  // namespace tessera
