// ModelOptions: checks, presets, and the parameter and FLOP counts (model_options.h).
//
// Preset shapes: GPT-2 from the released checkpoints; Llama 3.1, Qwen 3, Mixtral and DeepSeekMoE
// from their config.json files (parameter counts checked against transformers' models of those configs: tests/hf/); GPT-3 from Brown et al. 2020 Table 2.1, with
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

// The Llama family's block kinds (Llama 3.1: RMSNorm eps 1e-5, rotary with theta 500000 and the
// llama3 long-context scaling, SwiGLU, grouped-query attention, no biases, untied head).
ModelOptions llama(const std::string& name, int64_t vocab, int64_t block, int64_t layers, int64_t embd, int64_t heads,
                   int64_t kv_heads, int64_t hidden) {
  ModelOptions o = shape(name, vocab, block, layers, embd, heads);
  o.norm = "rmsnorm";
  o.position = "rope";
  o.rope_theta = 500000;
  o.rope_scaling = "llama3";
  o.mlp = "swiglu";
  o.ffn_hidden = hidden;
  o.n_kv_head = kv_heads;
  o.bias = false;
  o.tie_embeddings = false;
  return o;
}

// Qwen 3's: Llama's blocks with RMSNorm over each head of q and k, eps 1e-6, theta 1e6, no scaling,
// a head width of its own, and (the small ones) a tied head.
ModelOptions qwen3(const std::string& name, int64_t vocab, int64_t block, int64_t layers, int64_t embd, int64_t heads,
                   int64_t kv_heads, int64_t head_dim, int64_t hidden) {
  ModelOptions o = llama(name, vocab, block, layers, embd, heads, kv_heads, hidden);
  o.rope_theta = 1000000;
  o.rope_scaling = "none";
  o.norm_eps = 1e-6;
  o.head_dim = head_dim;
  o.qk_norm = true;
  o.tie_embeddings = true;
  return o;
}

// Mixtral's: Llama's blocks whose MLP is a mixture of SwiGLU experts, top-k of them per token with
// the softmax scores of the chosen ones renormalized, nothing dropped, theta 1e6, no scaling.
ModelOptions mixtral(const std::string& name, int64_t vocab, int64_t block, int64_t layers, int64_t embd, int64_t heads,
                     int64_t kv_heads, int64_t hidden, int64_t experts, int64_t top_k) {
  ModelOptions o = llama(name, vocab, block, layers, embd, heads, kv_heads, hidden);
  o.rope_theta = 1000000;
  o.rope_scaling = "none";
  o.ffn = "moe";
  o.moe_experts = experts;
  o.moe_top_k = top_k;
  o.moe_gates = "renormalized";
  o.moe_capacity_factor = 0;
  o.moe_aux_loss_coef = 0.02;  // Mixtral's router_aux_loss_coef
  o.moe_z_loss_coef = 0;
  return o;
}

// DeepSeek's MoE on Llama blocks: the first block dense, fine-grained experts of their own width
// beside shared ones, dropless, no z-loss, rotary without scaling.
ModelOptions deepseek_moe(ModelOptions o, int64_t experts, int64_t top_k, int64_t expert_width, int64_t shared) {
  o.rope_scaling = "none";
  o.ffn = "moe";
  o.moe_dense_layers = 1;
  o.moe_experts = experts;
  o.moe_top_k = top_k;
  o.moe_ffn_hidden = expert_width;
  o.moe_shared_experts = shared;
  o.moe_capacity_factor = 0;
  o.moe_z_loss_coef = 0;
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
      {"tiny_llama",
       [] {
         auto o = llama("tiny_llama", 256, 128, 4, 128, 4, 2, 352);
         o.rope_theta = 10000;
         o.rope_scaling = "none";
         return o;
       }},
      {"tiny_qwen3", [] { return qwen3("tiny_qwen3", 256, 128, 4, 128, 4, 2, 48, 352); }},
      {"tiny_mixtral",
       [] {
         auto o = mixtral("tiny_mixtral", 256, 128, 4, 128, 4, 2, 224, 8, 2);
         o.rope_theta = 10000;
         return o;
       }},
      // DeepSeek-V3's MoE at a tiny size (its attention, multi-head latent, is not built: GQA here):
      // fine-grained experts beside a shared one, sigmoid scores renormalized over the chosen and
      // scaled, chosen from the best 2 of 4 expert groups (V3: 4 of 8), aux-loss-free balancing with
      // a small balance loss, the first block dense.
      {"tiny_deepseek",
       [] {
         auto o = deepseek_moe(llama("tiny_deepseek", 256, 128, 4, 128, 4, 2, 352), 16, 4, 64, 1);
         o.rope_theta = 10000;
         o.moe_score = "sigmoid";
         o.moe_gates = "renormalized";
         o.moe_routed_scale = 2.5;
         o.moe_bias_update_rate = 0.001;
         o.moe_aux_loss_coef = 0.0001;
         o.moe_groups = 4;
         o.moe_topk_groups = 2;
         return o;
       }},
      // Mixtral 8x7B (its config.json).
      {"mixtral_8x7b", [] { return mixtral("mixtral_8x7b", 32000, 32768, 32, 4096, 32, 8, 14336, 8, 2); }},
      // DeepSeekMoE 16B (deepseek-moe-16b-base's config.json): 2 shared and 64 routed experts of
      // width 1408, top 6 of softmax scores not renormalized, the first block dense, full
      // multi-head attention.
      {"deepseek_moe_16b",
       [] {
         auto o = deepseek_moe(llama("deepseek_moe_16b", 102400, 4096, 28, 2048, 16, 16, 10944), 64, 6, 1408, 2);
         o.rope_theta = 10000;
         o.norm_eps = 1e-6;
         o.moe_gates = "scores";
         o.moe_aux_loss_coef = 0.001;
         return o;
       }},
      // Llama 3.1 (Meta's config.json of each size).
      {"llama3_8b", [] { return llama("llama3_8b", 128256, 131072, 32, 4096, 32, 8, 14336); }},
      {"llama3_70b", [] { return llama("llama3_70b", 128256, 131072, 80, 8192, 64, 8, 28672); }},
      {"llama3_405b", [] { return llama("llama3_405b", 128256, 131072, 126, 16384, 128, 8, 53248); }},
      // Qwen3-0.6B (its config.json).
      {"qwen3_0.6b", [] { return qwen3("qwen3_0.6b", 151936, 40960, 28, 1024, 16, 8, 128, 3072); }},
      // Qwen3-30B-A3B (its config.json): 128 experts of width 768 in every block, top 8 with the
      // chosen softmax scores renormalized (norm_topk_prob), an untied head.
      {"qwen3_30b_a3b",
       [] {
         auto o = qwen3("qwen3_30b_a3b", 151936, 40960, 48, 2048, 32, 4, 128, 6144);
         o.tie_embeddings = false;
         o.ffn = "moe";
         o.moe_every = 1;
         o.moe_experts = 128;
         o.moe_top_k = 8;
         o.moe_ffn_hidden = 768;
         o.moe_gates = "renormalized";
         o.moe_capacity_factor = 0;
         o.moe_aux_loss_coef = 0.001;
         o.moe_z_loss_coef = 0;
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
  require(head_dim > 0 || n_embd % n_head == 0, source,
          ": model.n_embd must be a multiple of model.n_head, or model.head_dim set (got n_embd ", n_embd, ", n_head ",
          n_head, ")");
  auto one_of = [&](const std::string& key, const std::string& value, std::initializer_list<const char*> allowed) {
    std::string list;
    for (const char* a : allowed) {
      if (value == a) return;
      list += (list.empty() ? "" : ", ") + std::string(a);
    }
    fail(source, ": model.", key, " must be one of ", list, " (got '", value, "')");
  };
  one_of("norm", norm, {"auto", "layernorm", "rmsnorm"});
  one_of("position", position, {"auto", "learned", "rope", "none"});
  one_of("rope_scaling", rope_scaling, {"none", "llama3"});
  one_of("mlp", mlp, {"auto", "gelu", "swiglu"});
  one_of("moe_gates", moe_gates, {"auto", "renormalized", "scores"});
  require(n_head % kv_heads() == 0, source, ": model.n_kv_head = ", kv_heads(),
          " must divide model.n_head = ", n_head, " (each key/value head serves n_head / n_kv_head query heads)");
  require(!rotary() || head_width() % 2 == 0, source, ": model.position = rope needs an even head width (got ",
          head_width(), ")");
  require(rope_scaling == "none" || rotary(), source, ": model.rope_scaling = ", rope_scaling,
          " needs model.position = rope");
  require(rope_scaling == "none" || rope_high_freq_factor > rope_low_freq_factor, source,
          ": model.rope_high_freq_factor (", rope_high_freq_factor, ") must exceed model.rope_low_freq_factor (",
          rope_low_freq_factor, ")");
  if (arch == "linear")
    require((position == "auto" || position == "none") && n_kv_head == 0 && head_dim == 0 && !qk_norm && !qkv_bias,
            source, ": model.arch = linear (lightning attention) takes none of model.position, n_kv_head, head_dim, "
            "qk_norm and qkv_bias: they shape softmax attention");
  require(moe_top_k <= moe_experts, source, ": model.moe_top_k must be at most model.moe_experts (got top_k ",
          moe_top_k, ", experts ", moe_experts, ")");
  require(moe_experts % moe_groups == 0 && (moe_groups == 1 || moe_experts / moe_groups >= 2), source,
          ": model.moe_groups = ", moe_groups, " must divide model.moe_experts = ", moe_experts,
          " into groups of at least 2 experts (a group is scored by its two best)");
  require(!moe_shared_gate || moe_shared_experts > 0, source,
          ": model.moe_shared_gate = true needs shared experts (model.moe_shared_experts > 0)");
  require(moe_topk_groups <= moe_groups, source, ": model.moe_topk_groups = ", moe_topk_groups,
          " must be at most model.moe_groups = ", moe_groups);
  require(moe_top_k <= routable_experts(), source, ": model.moe_top_k = ", moe_top_k, " exceeds the ",
          routable_experts(), " experts of model.moe_topk_groups = ", moe_topk_groups, " groups of ",
          moe_experts / moe_groups);
  require(ffn != "moe" || moe_every <= n_layer, source, ": model.moe_every must be at most model.n_layer (got ",
          moe_every, ", n_layer ", n_layer, ")");
  const int64_t first_moe = (moe_dense_layers + moe_every) / moe_every * moe_every - 1;
  require(ffn != "moe" || first_moe < n_layer, source, ": model.moe_dense_layers = ",
          moe_dense_layers, " with model.moe_every = ", moe_every, " leaves no MoE block among model.n_layer = ", n_layer);
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
