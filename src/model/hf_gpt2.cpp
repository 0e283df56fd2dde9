// Hugging Face GPT-2 folders (hf_gpt2.h).
#include "model/hf_gpt2.h"

#include <cmath>
#include <filesystem>
#include <set>

#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "core/json_file.h"
#include "model/hf_config.h"
#include "model/norm.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

}  // namespace

ModelOptions model_options_from_hf_config(const nlohmann::json& config, const ModelOptions& base,
                                          const std::string& source) {
  require(config.is_object(), source, ": not a JSON object");
  const std::string type = hf_string(config, "model_type", "", source);
  require(type == "gpt2", source, ": model_type '", type,
          "' cannot be imported; tessera imports gpt2, llama, mistral, qwen2 and qwen3");
  const std::string activation = hf_string(config, "activation_function", "gelu_new", source);
  require(activation == "gelu_new" || activation == "gelu_pytorch_tanh", source, ": activation_function '",
          activation, "' cannot be imported: tessera's GPT-2 uses the tanh GELU (gelu_new)");
  const double eps = hf_number(config, "layer_norm_epsilon", kNormEps, source);
  require(std::abs(eps - kNormEps) <= 1e-12, source, ": layer_norm_epsilon = ", eps,
          " cannot be imported: tessera's LayerNorm uses ", kNormEps);
  hf_expect(config, "tie_word_embeddings", true, source, "tessera's GPT-2 ties the output head to the token embedding");
  hf_expect(config, "scale_attn_weights", true, source, "tessera's GPT-2 scales attention scores by 1/sqrt(head_dim)");
  hf_expect(config, "scale_attn_by_inverse_layer_idx", false, source, "tessera's GPT-2 scales attention scores by 1/sqrt(head_dim) only");
  hf_expect(config, "add_cross_attention", false, source, "tessera's GPT-2 is a decoder without cross attention");

  ModelOptions o = base;
  o.preset = "";
  o.arch = "gpt";
  o.ffn = "dense";
  o.bias = true;
  o.vocab_size = hf_int(config, "vocab_size", source);
  o.n_layer = hf_int(config, "n_layer", source);
  o.n_head = hf_int(config, "n_head", source);
  o.n_embd = hf_int(config, "n_embd", source);
  o.block_size = hf_int(config, "n_positions", source);
  o.mlp_ratio = 4;
  if (const auto inner = config.find("n_inner"); inner != config.end() && !inner->is_null()) {
    const int64_t hidden = hf_int(config, "n_inner", source);
    require(hidden % o.n_embd == 0, source, ": n_inner = ", hidden, " is not a multiple of n_embd = ", o.n_embd,
            " (tessera's MLP is mlp_ratio x n_embd wide)");
    o.mlp_ratio = hidden / o.n_embd;
  }
  o.dropout = hf_number(config, "resid_pdrop", o.dropout, source);
  o.check(source);
  return o;
}

nlohmann::json hf_config_from_model_options(const ModelOptions& o) {
  require(o.arch == "gpt" && o.ffn == "dense" && o.bias, "internal: a Hugging Face GPT-2 config for a model that is not GPT-2");
  return {{"architectures", {"GPT2LMHeadModel"}},
          {"model_type", "gpt2"},
          {"vocab_size", o.vocab_size},
          {"n_positions", o.block_size},
          {"n_ctx", o.block_size},
          {"n_embd", o.n_embd},
          {"n_layer", o.n_layer},
          {"n_head", o.n_head},
          {"n_inner", o.hidden()},
          {"activation_function", "gelu_new"},
          {"resid_pdrop", o.dropout},
          {"embd_pdrop", o.dropout},
          {"attn_pdrop", o.dropout},
          {"layer_norm_epsilon", kNormEps},
          {"initializer_range", 0.02},
          {"scale_attn_weights", true},
          {"scale_attn_by_inverse_layer_idx", false},
          {"reorder_and_upcast_attn", false},
          {"tie_word_embeddings", true},
          {"use_cache", true},
          // GPT-2's <|endoftext|> for its vocabulary; no such token in any other.
          {"bos_token_id", o.vocab_size == 50257 ? nlohmann::json(50256) : nlohmann::json(nullptr)},
          {"eos_token_id", o.vocab_size == 50257 ? nlohmann::json(50256) : nlohmann::json(nullptr)},
          {"torch_dtype", "float32"}};
}

std::set<std::string> hf_weight_files(const std::string& dir) {
  const fs::path root(dir);
  std::set<std::string> files;
  if (fs::exists(root / "model.safetensors")) {
    files.insert((root / "model.safetensors").string());
  } else if (fs::exists(root / "model.safetensors.index.json")) {
    const std::string index_path = (root / "model.safetensors.index.json").string();
    const nlohmann::json index = read_json_file(index_path);
    require(index.contains("weight_map") && index["weight_map"].is_object(), index_path, ": has no weight_map object");
    for (const auto& [name, file] : index["weight_map"].items()) {
      require(file.is_string() && fs::path(file.get<std::string>()).filename() == file.get<std::string>(), index_path,
              ": weight_map['", name, "'] is not a file name in ", dir);
      files.insert((root / file.get<std::string>()).string());
    }
  } else {
    fail(dir, ": holds no model.safetensors (nor model.safetensors.index.json)",
         fs::exists(root / "pytorch_model.bin")
             ? "; it has pytorch_model.bin, which tessera does not read: save it with transformers' "
               "save_pretrained(DIR, safe_serialization=True)"
             : "");
  }
  return files;
}

std::map<std::string, at::Tensor> read_hf_gpt2_weights(const std::string& dir) {
  const std::set<std::string> files = hf_weight_files(dir);
  std::map<std::string, at::Tensor> weights;
  at::Tensor head;
  for (const std::string& file : files) {
    for (auto& [stored, tensor] : read_safetensors(file).tensors) {
      const std::string name = stored.rfind("transformer.", 0) == 0 ? stored.substr(12) : stored;
      const bool mask = name.size() > 10 && (name.compare(name.size() - 10, 10, ".attn.bias") == 0 ||
                                             name.find(".attn.masked_bias") != std::string::npos);
      if (mask) continue;
      if (name == "lm_head.weight") {
        head = tensor;
        continue;
      }
      require(weights.emplace("transformer." + name, tensor).second, file, ": tensor '", stored,
              "' appears twice in ", dir);
    }
  }
  if (head.defined()) {
    const auto wte = weights.find("transformer.wte.weight");
    require(wte != weights.end() && wte->second.sizes() == head.sizes() &&
                at::equal(wte->second.to(at::kFloat), head.to(at::kFloat)),
            dir, ": lm_head.weight differs from the token embedding wte.weight; tessera's GPT-2 ties the two "
            "(an untied head cannot be imported)");
  }
  return weights;
}

}  // namespace tessera
