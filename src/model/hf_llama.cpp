// Hugging Face folders of the Llama family (hf_llama.h).
#include "model/hf_llama.h"

#include <algorithm>
#include <functional>
#include <cmath>
#include <regex>
#include <set>

#include <ATen/ATen.h>

#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "model/hf_config.h"
#include "model/hf_gpt2.h"

namespace tessera {
namespace {

const std::set<std::string> kTypes = {"llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe"};

// What in `o`'s experts Qwen's MoE configs cannot say (empty: nothing): softmax scores, chosen as
// they are or renormalized (norm_topk_prob), every decoder_sparse_step-th block after the first
// moe_dense_layers (mlp_only_layers), no selection bias, no groups; Qwen 3 MoE (q/k norms) has no
// shared experts, Qwen2-MoE (q, k, v biases) gated ones (shared_expert_gate).
std::string qwen_moe_refusal(const ModelOptions& o) {
  if (o.qk_norm && o.moe_shared_experts != 0) return "shared experts (Qwen 3 MoE has none)";
  if (o.qkv_bias && (o.moe_shared_experts == 0 || !o.moe_shared_gate))
    return "experts without a gated shared one (Qwen2-MoE's has shared_expert_gate)";
  if (o.moe_score != "softmax" || o.moe_routed_scale != 1) return "gates other than softmax scores (Qwen 3 MoE's)";
  if (o.moe_bias_update_rate != 0 || o.moe_groups != 1) return "an aux-loss-free selection bias or expert groups";
  if (o.qk_norm == o.qkv_bias) return "MoE blocks need exactly one of q/k norms (Qwen 3 MoE) and q, k, v biases (Qwen2-MoE)";
  return "";
}

// The names of one MoE block's tensors under model.layers.{i}. in the files: the router's, the
// prefix of expert e's (then "{e}."), and its up, gate and down projections.
struct ExpertNames {
  const char *router, *experts, *up, *gate, *down;
};
ExpertNames expert_names(bool qwen) {
  if (qwen) return {"mlp.gate.weight", "mlp.experts.", "up_proj", "gate_proj", "down_proj"};
  return {"block_sparse_moe.gate.weight", "block_sparse_moe.experts.", "w3", "w1", "w2"};  // Mixtral's
}

// Whether `o` is a mixture of experts that Mixtral's config describes exactly.
std::string mixtral_refusal(const ModelOptions& o) {
  if (o.moe_every != 1 || o.moe_dense_layers != 0) return "dense blocks among the MoE ones (Mixtral's are all MoE)";
  if (o.moe_shared_experts != 0) return "shared experts (Mixtral has none)";
  if (o.moe_score != "softmax" || !o.renormalized_gates() || o.moe_routed_scale != 1)
    return "gates other than softmax scores renormalized over the chosen experts (Mixtral's)";
  if (o.moe_bias_update_rate != 0 || o.moe_groups != 1)
    return "an aux-loss-free selection bias or expert groups (Mixtral routes by the scores alone)";
  if (o.moe_shared_gate) return "a gated shared expert (Mixtral has none)";
  if (o.moe_ffn_hidden != 0 && o.moe_ffn_hidden != o.hidden()) return "experts of another width than ffn_hidden";
  return "";
}

}  // namespace

bool is_hf_llama_family(const nlohmann::json& config) {
  return config.is_object() && config.contains("model_type") && config["model_type"].is_string() &&
         kTypes.count(config["model_type"].get<std::string>());
}

ModelOptions llama_family_options_from_hf_config(const nlohmann::json& config, const ModelOptions& base,
                                                 const std::string& source) {
  require(is_hf_llama_family(config), source,
          ": not a Llama-family config (model_type llama, mistral, mixtral, qwen2, qwen2_moe, qwen3 or qwen3_moe)");
  const std::string type = config["model_type"].get<std::string>();
  hf_expect(config, "hidden_act", "silu", source, "tessera's SwiGLU gates with silu");
  hf_expect(config, "mlp_bias", false, source, "tessera's SwiGLU has no biases");
  if (type == "llama" || type == "mistral")
    hf_expect(config, "attention_bias", false, source,
                 "tessera gives q, k and v biases (model.qkv_bias) but none to the output projection");

  ModelOptions o = base;
  o.preset = "";
  o.arch = "gpt";
  o.ffn = "dense";
  o.bias = false;
  o.norm = "rmsnorm";
  o.position = "rope";
  o.mlp = "swiglu";
  o.vocab_size = hf_int(config, "vocab_size", source);
  o.n_embd = hf_int(config, "hidden_size", source);
  o.ffn_hidden = hf_int(config, "intermediate_size", source);
  o.n_layer = hf_int(config, "num_hidden_layers", source);
  o.n_head = hf_int(config, "num_attention_heads", source);
  o.n_kv_head = config.contains("num_key_value_heads") && !config["num_key_value_heads"].is_null()
                    ? hf_int(config, "num_key_value_heads", source)
                    : o.n_head;
  const int64_t head_dim = config.contains("head_dim") && !config["head_dim"].is_null()
                               ? hf_int(config, "head_dim", source)
                               : o.n_embd / o.n_head;
  // 0: the width's share of a head. Compared by division: head_dim * n_head overflows for a huge head_dim.
  o.head_dim = o.n_embd % o.n_head == 0 && head_dim == o.n_embd / o.n_head ? 0 : head_dim;
  o.block_size = hf_int(config, "max_position_embeddings", source);
  if (type == "mixtral") {
    hf_expect(config, "router_jitter_noise", 0.0, source, "tessera's router reads the tokens as they are");
    o.ffn = "moe";
    o.moe_every = 1;
    o.moe_experts = hf_int(config, "num_local_experts", source);
    o.moe_top_k = hf_int(config, "num_experts_per_tok", source);
    o.moe_gates = "renormalized";
    o.moe_capacity_factor = 0;
    o.moe_aux_loss_coef = hf_number(config, "router_aux_loss_coef", 0.001, source);
    o.moe_z_loss_coef = 0;
  }
  if (type == "qwen3_moe" || type == "qwen2_moe") {
    o.ffn = "moe";
    // The Hub's files say num_experts; transformers 5 writes num_local_experts.
    o.moe_experts = hf_int(config, config.contains("num_experts") ? "num_experts" : "num_local_experts", source);
    o.moe_top_k = hf_int(config, "num_experts_per_tok", source);
    o.moe_ffn_hidden = hf_int(config, "moe_intermediate_size", source);
    o.moe_every = config.contains("decoder_sparse_step") ? hf_int(config, "decoder_sparse_step", source) : 1;
    // mlp_only_layers: dense blocks, which tessera places only as the first ones (moe_dense_layers).
    o.moe_dense_layers = 0;
    if (config.contains("mlp_only_layers") && !config["mlp_only_layers"].is_null()) {
      const nlohmann::json& dense = config["mlp_only_layers"];
      require(dense.is_array(), source, ": 'mlp_only_layers' is not a list");
      for (size_t i = 0; i < dense.size(); ++i)
        require(dense[i].is_number_integer() && dense[i].get<int64_t>() == static_cast<int64_t>(i), source,
                ": mlp_only_layers = ", dense.dump(), " cannot be imported: tessera's dense blocks are the first ",
                "ones (model.moe_dense_layers), so the list must be 0, 1, ..., n - 1");
      o.moe_dense_layers = static_cast<int64_t>(dense.size());
    }
    o.moe_gates = hf_bool(config, "norm_topk_prob", false, source) ? "renormalized" : "scores";
    o.moe_capacity_factor = 0;
    o.moe_aux_loss_coef = hf_number(config, "router_aux_loss_coef", 0.001, source);
    o.moe_z_loss_coef = 0;
    if (type == "qwen2_moe") {  // one shared expert of its own width, behind a sigmoid gate
      const int64_t shared = hf_int(config, "shared_expert_intermediate_size", source);
      require(shared % o.moe_ffn_hidden == 0, source, ": shared_expert_intermediate_size = ", shared,
              " cannot be imported: tessera's shared experts are model.moe_shared_experts of moe_intermediate_size = ",
              o.moe_ffn_hidden, " each, so it must be a multiple of it");
      o.moe_shared_experts = shared / o.moe_ffn_hidden;
      o.moe_shared_gate = true;
    }
  }
  if ((type == "mistral" || type == "mixtral") && config.contains("sliding_window") && !config["sliding_window"].is_null())
    o.block_size = std::min(o.block_size, hf_int(config, "sliding_window", source));
  o.norm_eps = hf_number(config, "rms_norm_eps", 1e-6, source);
  // Rotary parameters: transformers 5 writes them in "rope_parameters" (rope_theta, rope_type and
  // the scaling's factors); earlier versions (most Hub files) in "rope_theta" and "rope_scaling".
  const auto parameters = config.find("rope_parameters");
  const bool v5 = parameters != config.end() && !parameters->is_null();
  require(!v5 || parameters->is_object(), source, ": 'rope_parameters' is not an object");
  o.rope_theta = hf_number(v5 ? *parameters : config, "rope_theta", 10000, source);
  o.rope_scaling = "none";
  const auto scaling = v5 ? parameters : config.find("rope_scaling");
  if (scaling != config.end() && !scaling->is_null()) {
    require(scaling->is_object(), source, ": 'rope_scaling' is not an object");
    const std::string kind = hf_string(*scaling, "rope_type", hf_string(*scaling, "type", "default", source), source);
    require(kind == "llama3" || kind == "default", source, ": rope scaling of type '", kind,
            "' cannot be imported: tessera scales rotary frequencies as Llama 3.1 does (rope_type llama3) or not at all");
    if (kind == "llama3") {
      o.rope_scaling = "llama3";
      o.rope_factor = hf_number(*scaling, "factor", o.rope_factor, source);
      o.rope_low_freq_factor = hf_number(*scaling, "low_freq_factor", o.rope_low_freq_factor, source);
      o.rope_high_freq_factor = hf_number(*scaling, "high_freq_factor", o.rope_high_freq_factor, source);
      o.rope_original_context = hf_int(*scaling, "original_max_position_embeddings", source);
    }
  }
  const bool qwen3 = type == "qwen3" || type == "qwen3_moe", qwen2 = type == "qwen2" || type == "qwen2_moe";
  if (qwen2 || qwen3)
    hf_expect(config, "use_sliding_window", false, source, "tessera's attention is full causal attention");
  if (qwen3)
    hf_expect(config, "attention_bias", false, source,
                 "Qwen 3's attention_bias also puts a bias on the output projection, which tessera does not");
  o.qkv_bias = qwen2;
  o.qk_norm = qwen3;
  o.tie_embeddings = hf_bool(config, "tie_word_embeddings", false, source);
  o.check(source);
  return o;
}

namespace {

// A folder's tensors by name, each read from its file when taken (the files' headers are read
// once, up front), and which were taken.
class FolderTensors {
 public:
  explicit FolderTensors(const std::string& dir) : dir_(dir) {
    for (const std::string& file : hf_weight_files(dir))
      for (const auto& [name, entry] : read_safetensors_header(file).tensors)
        require(file_of_.emplace(name, file).second, file, ": tensor '", name, "' appears twice in ", dir);
  }
  bool has(const std::string& name) const { return file_of_.count(name) > 0; }
  at::Tensor take(const std::string& name) {
    const auto it = file_of_.find(name);
    require(it != file_of_.end(), dir_, ": missing tensor '", name, "'");
    used_.insert(name);
    return read_safetensors_tensor(it->second, name);
  }
  // Refuses a tensor no part took (the rotary tables some files keep aside).
  void check_all_taken(const ModelOptions& o, bool qkv_bias) const {
    for (const auto& [name, file] : file_of_)
      require(used_.count(name) || name.find("rotary_emb.inv_freq") != std::string::npos, dir_, ": unexpected tensor '",
              name, "' (the config describes ", o.n_layer, " layers", o.qk_norm ? " with q and k norms" : "",
              qkv_bias ? " with q, k, v biases" : "", ")");
  }

 private:
  std::string dir_;
  std::map<std::string, std::string> file_of_;
  std::set<std::string> used_;
};

// Block `l`'s tensors under tessera's names ("model.h.<l>...."), from the folder's.
std::map<std::string, at::Tensor> read_block(FolderTensors& in, const ModelOptions& o, int64_t l) {
  std::map<std::string, at::Tensor> out;
  auto take = [&in](const std::string& name) { return in.take(name); };
  auto has = [&in](const std::string& name) { return in.has(name); };
  auto put = [&](const std::string& param, const at::Tensor& t) { out.emplace("model." + param, t); };
  const bool qkv_bias = o.bias || o.qkv_bias;
  const std::string hf = "model.layers." + std::to_string(l) + ".", ours = "h." + std::to_string(l) + ".";
  put(ours + "ln_1.weight", take(hf + "input_layernorm.weight"));
  put(ours + "ln_2.weight", take(hf + "post_attention_layernorm.weight"));
  std::vector<std::string> kinds = {"weight"};
  if (qkv_bias) kinds.push_back("bias");
  for (const std::string& kind : kinds) {
    const at::Tensor q = take(hf + "self_attn.q_proj." + kind), k = take(hf + "self_attn.k_proj." + kind),
                     v = take(hf + "self_attn.v_proj." + kind);
    if (o.fused_qkv()) {
      put(ours + "attn.c_attn." + kind, at::cat({q, k, v}));
    } else {
      put(ours + "attn.q_proj." + kind, q);
      put(ours + "attn.kv_proj." + kind, at::cat({k, v}));
    }
  }
  if (o.qk_norm) {
    put(ours + "attn.q_norm.weight", take(hf + "self_attn.q_norm.weight"));
    put(ours + "attn.k_norm.weight", take(hf + "self_attn.k_norm.weight"));
  }
  put(ours + "attn.c_proj.weight", take(hf + "self_attn.o_proj.weight"));
  if (!o.is_moe_block(l)) {
    put(ours + "mlp.c_fc.weight", at::cat({take(hf + "mlp.up_proj.weight"), take(hf + "mlp.gate_proj.weight")}));
    put(ours + "mlp.c_proj.weight", take(hf + "mlp.down_proj.weight"));
    return out;
  }
  // The experts: Mixtral's files (w1 gate, w3 up, w2 down per expert; the Hub's and
  // save_pretrained's), Qwen 3 MoE's (gate_proj, up_proj, down_proj per expert), or stacked as
  // transformers 5 holds either in memory (gate_up_proj: gate rows, then up).
  const std::string stacked = hf + "mlp.experts.";
  if (o.moe_shared_gate) {  // Qwen2-MoE's gated shared expert, beside either form of the experts
    const std::string shared = hf + "mlp.shared_expert.";
    put(ours + "moe.shared.c_fc.weight", at::cat({take(shared + "up_proj.weight"), take(shared + "gate_proj.weight")}));
    put(ours + "moe.shared.c_proj.weight", take(shared + "down_proj.weight"));
    put(ours + "moe.shared_gate.weight", take(hf + "mlp.shared_expert_gate.weight"));
  }
  if (has(stacked + "gate_up_proj")) {
    put(ours + "moe.router.weight", take(hf + "mlp.gate.weight"));
    const at::Tensor gate_up = take(stacked + "gate_up_proj");  // [E, 2H, C]
    const int64_t H = gate_up.size(1) / 2;
    put(ours + "moe.w_fc", at::cat({gate_up.narrow(1, H, H), gate_up.narrow(1, 0, H)}, 1).transpose(1, 2));
    put(ours + "moe.w_proj", take(stacked + "down_proj").transpose(1, 2));
    return out;
  }
  const ExpertNames names = expert_names(has(stacked + "0.gate_proj.weight"));
  put(ours + "moe.router.weight", take(hf + names.router));
  std::vector<at::Tensor> fc, proj;
  for (int64_t e = 0; e < o.moe_experts; ++e) {
    const std::string expert = hf + names.experts + std::to_string(e) + ".";
    fc.push_back(at::cat({take(expert + names.up + ".weight"), take(expert + names.gate + ".weight")}).t());
    proj.push_back(take(expert + names.down + ".weight").t());
  }
  put(ours + "moe.w_fc", at::stack(fc));
  put(ours + "moe.w_proj", at::stack(proj));
  return out;
}

}  // namespace

void read_hf_llama_parts(const std::string& dir, const ModelOptions& o,
                         const std::function<void(std::map<std::string, at::Tensor>)>& consume) {
  FolderTensors in(dir);
  {
    // The embedding, and the untied head or the check that a saved head is the embedding.
    std::map<std::string, at::Tensor> ends;
    const at::Tensor embedding = in.take("model.embed_tokens.weight");
    ends.emplace("model.wte.weight", embedding);
    if (!o.tie_embeddings) {
      ends.emplace("model.lm_head.weight", in.take("lm_head.weight"));
    } else if (in.has("lm_head.weight")) {
      const at::Tensor head = in.take("lm_head.weight");
      require(head.sizes() == embedding.sizes() && at::equal(head.to(at::kFloat), embedding.to(at::kFloat)), dir,
              ": lm_head.weight differs from model.embed_tokens.weight, but config.json ties them (tie_word_embeddings)");
    }
    consume(std::move(ends));
  }
  for (int64_t l = 0; l < o.n_layer; ++l) consume(read_block(in, o, l));
  consume({{"model.ln_f.weight", in.take("model.norm.weight")}});
  in.check_all_taken(o, o.bias || o.qkv_bias);
}

std::map<std::string, at::Tensor> read_hf_llama_weights(const std::string& dir, const ModelOptions& o) {
  std::map<std::string, at::Tensor> out;
  read_hf_llama_parts(dir, o, [&out](std::map<std::string, at::Tensor> part) { out.merge(part); });
  return out;
}

std::string hf_llama_family_refusal(const ModelOptions& o) {
  if (o.arch != "gpt") return "arch " + o.arch;
  if (o.ffn == "moe") {  // with q/k norms Qwen 3 MoE, with q, k, v biases Qwen2-MoE, else Mixtral
    const std::string moe = o.qk_norm || o.qkv_bias ? qwen_moe_refusal(o) : mixtral_refusal(o);
    if (!moe.empty()) return moe;
  }
  if (o.bias) return "bias = true (the family's linears have none but q, k, v: model.qkv_bias)";
  if (!o.rms_norm()) return "LayerNorm (the family's norms are RMSNorm)";
  if (!o.rotary()) return "position " + o.position + " (the family's positions are rotary)";
  if (!o.swiglu()) return "a GELU MLP (the family's is SwiGLU)";
  if (o.qk_norm && o.qkv_bias) return "both qk_norm and qkv_bias";
  return "";
}

nlohmann::json hf_llama_family_config(const ModelOptions& o) {
  const std::string refusal = hf_llama_family_refusal(o);
  require(refusal.empty(), "internal: a Llama-family config for a model with ", refusal);
  const std::string type = o.ffn == "moe" ? (o.qk_norm ? "qwen3_moe" : o.qkv_bias ? "qwen2_moe" : "mixtral")
                           : o.qk_norm    ? "qwen3"
                           : o.qkv_bias   ? "qwen2"
                                          : "llama";
  nlohmann::json rope = {{"rope_type", o.rope_scaling == "llama3" ? "llama3" : "default"}, {"rope_theta", o.rope_theta}};
  if (o.rope_scaling == "llama3")
    rope.update({{"factor", o.rope_factor},
                 {"low_freq_factor", o.rope_low_freq_factor},
                 {"high_freq_factor", o.rope_high_freq_factor},
                 {"original_max_position_embeddings", o.rope_original_context}});
  const std::string architecture = type == "mixtral"     ? "MixtralForCausalLM"
                                   : type == "qwen3_moe" ? "Qwen3MoeForCausalLM"
                                   : type == "qwen2_moe" ? "Qwen2MoeForCausalLM"
                                   : type == "qwen3"     ? "Qwen3ForCausalLM"
                                   : type == "qwen2" ? "Qwen2ForCausalLM"
                                                     : "LlamaForCausalLM";
  nlohmann::json config = {{"architectures", {architecture}},
                           {"model_type", type},
                           {"vocab_size", o.vocab_size},
                           {"hidden_size", o.n_embd},
                           {"intermediate_size", o.hidden()},
                           {"num_hidden_layers", o.n_layer},
                           {"num_attention_heads", o.n_head},
                           {"num_key_value_heads", o.kv_heads()},
                           {"head_dim", o.head_width()},
                           {"max_position_embeddings", o.block_size},
                           {"rms_norm_eps", o.norm_eps},
                           {"hidden_act", "silu"},
                           {"tie_word_embeddings", o.tie_embeddings},
                           {"attention_dropout", 0.0},
                           {"mlp_bias", false},
                           // transformers 5 reads rope_parameters, earlier versions these two
                           {"rope_parameters", rope},
                           {"rope_theta", o.rope_theta},
                           {"rope_scaling", o.rope_scaling == "llama3" ? rope : nlohmann::json(nullptr)},
                           {"bos_token_id", nullptr},
                           {"eos_token_id", nullptr},
                           {"torch_dtype", "float32"}};
  if (type == "llama" || type == "qwen3" || type == "qwen3_moe") config["attention_bias"] = false;
  if (type == "qwen2" || type == "qwen2_moe" || type == "qwen3" || type == "qwen3_moe") config["use_sliding_window"] = false;
  if (type == "qwen3_moe" || type == "qwen2_moe") {
    std::vector<int64_t> dense(static_cast<size_t>(o.moe_dense_layers));
    for (size_t i = 0; i < dense.size(); ++i) dense[i] = static_cast<int64_t>(i);
    config.update({{"num_experts", o.moe_experts},
                   {"num_experts_per_tok", o.moe_top_k},
                   {"moe_intermediate_size", o.expert_hidden()},
                   {"norm_topk_prob", o.renormalized_gates()},
                   {"decoder_sparse_step", o.moe_every},
                   {"mlp_only_layers", dense},
                   {"router_aux_loss_coef", o.moe_aux_loss_coef},
                   {"output_router_logits", false}});
    if (type == "qwen2_moe") config["shared_expert_intermediate_size"] = o.moe_shared_experts * o.expert_hidden();
  }
  if (type == "mixtral")
    config.update({{"num_local_experts", o.moe_experts},
                   {"num_experts_per_tok", o.moe_top_k},
                   {"router_aux_loss_coef", o.moe_aux_loss_coef},
                   {"output_router_logits", false},
                   {"router_jitter_noise", 0.0},
                   {"sliding_window", nullptr}});
  return config;
}

std::map<std::string, at::Tensor> hf_llama_family_part(const ModelOptions& o, int64_t part,
                                                       const std::function<at::Tensor(const std::string&)>& get) {
  std::map<std::string, at::Tensor> out;
  auto put = [&](const std::string& name, const at::Tensor& t) { out.emplace(name, t.contiguous()); };
  if (part == 0) {
    put("model.embed_tokens.weight", get("wte.weight"));
    if (!o.tie_embeddings) put("lm_head.weight", get("lm_head.weight"));
    return out;
  }
  if (part == o.n_layer + 1) {
    put("model.norm.weight", get("ln_f.weight"));
    return out;
  }
  require(part > 0 && part <= o.n_layer, "internal: no part ", part, " of a model of ", o.n_layer, " blocks");
  const int64_t l = part - 1;
  const int64_t q_rows = o.n_head * o.head_width(), kv_rows = o.kv_heads() * o.head_width();
  std::vector<std::string> kinds = {"weight"};
  if (o.qkv_bias) kinds.push_back("bias");
  const std::string hf = "model.layers." + std::to_string(l) + ".", h = "h." + std::to_string(l) + ".";
  put(hf + "input_layernorm.weight", get(h + "ln_1.weight"));
  put(hf + "post_attention_layernorm.weight", get(h + "ln_2.weight"));
  for (const std::string& kind : kinds) {
    const at::Tensor q = o.fused_qkv() ? get(h + "attn.c_attn." + kind).narrow(0, 0, q_rows)
                                       : get(h + "attn.q_proj." + kind);
    const at::Tensor kv = o.fused_qkv() ? get(h + "attn.c_attn." + kind).narrow(0, q_rows, 2 * kv_rows)
                                        : get(h + "attn.kv_proj." + kind);
    put(hf + "self_attn.q_proj." + kind, q);
    put(hf + "self_attn.k_proj." + kind, kv.narrow(0, 0, kv_rows));
    put(hf + "self_attn.v_proj." + kind, kv.narrow(0, kv_rows, kv_rows));
  }
  if (o.qk_norm) {
    put(hf + "self_attn.q_norm.weight", get(h + "attn.q_norm.weight"));
    put(hf + "self_attn.k_norm.weight", get(h + "attn.k_norm.weight"));
  }
  put(hf + "self_attn.o_proj.weight", get(h + "attn.c_proj.weight"));
  if (o.is_moe_block(l)) {
    const ExpertNames names = expert_names(o.qk_norm || o.qkv_bias);
    put(hf + names.router, get(h + "moe.router.weight"));
    const at::Tensor fc = get(h + "moe.w_fc"), proj = get(h + "moe.w_proj");  // [E, C, 2H], [E, H, C]
    const int64_t H = proj.size(1);
    for (int64_t e = 0; e < o.moe_experts; ++e) {
      const std::string expert = hf + names.experts + std::to_string(e) + ".";
      put(expert + names.up + ".weight", fc[e].narrow(1, 0, H).t());
      put(expert + names.gate + ".weight", fc[e].narrow(1, H, H).t());
      put(expert + names.down + ".weight", proj[e].t());
    }
    if (o.moe_shared_gate) {
      const std::string shared = hf + "mlp.shared_expert.";
      const at::Tensor up_gate = get(h + "moe.shared.c_fc.weight");
      const int64_t S = up_gate.size(0) / 2;
      put(shared + "up_proj.weight", up_gate.narrow(0, 0, S));
      put(shared + "gate_proj.weight", up_gate.narrow(0, S, S));
      put(shared + "down_proj.weight", get(h + "moe.shared.c_proj.weight"));
      put(hf + "mlp.shared_expert_gate.weight", get(h + "moe.shared_gate.weight"));
    }
    return out;
  }
  const at::Tensor up_gate = get(h + "mlp.c_fc.weight");
  put(hf + "mlp.up_proj.weight", up_gate.narrow(0, 0, o.hidden()));
  put(hf + "mlp.gate_proj.weight", up_gate.narrow(0, o.hidden(), o.hidden()));
  put(hf + "mlp.down_proj.weight", get(h + "mlp.c_proj.weight"));
  return out;
}

std::map<std::string, at::Tensor> hf_llama_family_weights(const ModelOptions& o,
                                                          const std::map<std::string, at::Tensor>& ours) {
  auto get = [&](const std::string& param) {
    const auto it = ours.find("model." + param);
    require(it != ours.end(), "export: the checkpoint has no tensor 'model.", param, "'");
    return it->second;
  };
  std::map<std::string, at::Tensor> out;
  for (int64_t part = 0; part < hf_llama_part_count(o); ++part) out.merge(hf_llama_family_part(o, part, get));
  return out;
}

}  // namespace tessera
