// Hugging Face GPT-2 folders, as transformers' save_pretrained writes them:
//
//   config.json                     GPT2Config (model_type "gpt2")
//   model.safetensors               the weights, or
//   model.safetensors.index.json    {"weight_map": {name: file}} with model-0000k-of-0000N.safetensors
//   vocab.json, merges.txt          GPT-2's byte-level BPE (optional; the same files as OpenAI's
//                                   encoder.json and vocab.bpe)
//
// The GPT-2 that tessera builds (arch gpt, ffn dense, bias true, tied head, tanh GELU, LayerNorm
// eps 1e-5, attention scaled by 1/sqrt(head_dim)) is GPT2LMHeadModel exactly, so a folder maps to
// ModelOptions and back. A config that asks for anything else (another model_type, exact GELU, an
// untied head, cross attention, attention scaled per layer) is refused naming the key: importing
// it would give a model that computes something else.
//
// Tensor names: GPT2LMHeadModel saves "transformer.<param>", GPT2Model "<param>"; both are read
// and returned under tessera's export names ("transformer.<param>", model/hf_names.h). The causal
// mask buffers (h.N.attn.bias, h.N.attn.masked_bias) that older transformers saved are dropped; a
// saved lm_head.weight must equal the token embedding (the head is tied).
#pragma once

#include <map>
#include <set>
#include <string>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "model/model_options.h"

namespace tessera {

// The model a GPT2Config describes (vocab_multiple and dropout as given in `base`; dropout is set
// from resid_pdrop). Throws tessera::Error naming `source` and the key it cannot import.
ModelOptions model_options_from_hf_config(const nlohmann::json& config, const ModelOptions& base,
                                          const std::string& source);

// The GPT2Config of `opts`, which must use the Hugging Face GPT-2 names (uses_hf_gpt2_names).
nlohmann::json hf_config_from_model_options(const ModelOptions& opts);

// The safetensors files of a Hugging Face folder: model.safetensors, or the files its
// model.safetensors.index.json names; refuses a folder with neither, naming it.
std::set<std::string> hf_weight_files(const std::string& dir);

// The weights of the folder `dir`, under tessera's export names, as stored (dtype kept).
std::map<std::string, at::Tensor> read_hf_gpt2_weights(const std::string& dir);

}  // namespace tessera
