// Hugging Face folders of the Llama family: LlamaForCausalLM (Llama 2 and 3), MistralForCausalLM,
// MixtralForCausalLM, Qwen2ForCausalLM, Qwen2MoeForCausalLM, Qwen3ForCausalLM and
// Qwen3MoeForCausalLM, as transformers' save_pretrained writes them (config.json,
// model.safetensors or its sharded index).
//
// The config maps to the block kinds of model_options.h: RMSNorm (rms_norm_eps), rotary positions
// (rope_theta, and rope_scaling of type llama3), SwiGLU (intermediate_size), grouped-query
// attention (num_key_value_heads, head_dim), Qwen 2's q, k, v biases, Qwen 3's q and k norms,
// tie_word_embeddings; Mixtral's experts (num_local_experts, num_experts_per_tok: a dropless MoE
// in every block with renormalized softmax gates and SwiGLU experts; router_aux_loss_coef is the
// weight of tessera's balance loss, which counts top-1 choices where Mixtral's counts all k;
// router_jitter_noise must be 0); Qwen 3 MoE's (num_experts, num_experts_per_tok,
// moe_intermediate_size, norm_topk_prob: renormalized or raw softmax gates, decoder_sparse_step as
// model.moe_every, mlp_only_layers as model.moe_dense_layers when it lists the first blocks, and
// is refused otherwise); Qwen2-MoE's the same with shared_expert_intermediate_size as
// model.moe_shared_experts experts of moe_intermediate_size (a multiple, else refused) behind
// shared_expert_gate (model.moe_shared_gate). Mistral's and Mixtral's sliding window is exact within its width: block_size is the
// smaller of max_position_embeddings and sliding_window. What tessera would compute otherwise is
// refused naming the key: another activation than silu, MLP or output-projection biases
// (attention_bias on Llama and Mistral, mlp_bias), another rope_scaling type.
//
// Tensor names (HF -> tessera's export names, "model." + the parameter):
//   model.embed_tokens.weight                        model.wte.weight
//   model.layers.{i}.input_layernorm.weight          model.h.{i}.ln_1.weight
//   model.layers.{i}.self_attn.{q,k,v}_proj.*        model.h.{i}.attn.c_attn.* (q, k, v rows) where
//                                                    fused_qkv(), else attn.q_proj.* and
//                                                    attn.kv_proj.* (k, v rows)
//   model.layers.{i}.self_attn.{q,k}_norm.weight     model.h.{i}.attn.{q,k}_norm.weight
//   model.layers.{i}.self_attn.o_proj.weight         model.h.{i}.attn.c_proj.weight
//   model.layers.{i}.post_attention_layernorm.weight model.h.{i}.ln_2.weight
//   model.layers.{i}.mlp.{up,gate}_proj.weight       model.h.{i}.mlp.c_fc.weight (up rows, then gate)
//   model.layers.{i}.mlp.down_proj.weight            model.h.{i}.mlp.c_proj.weight
//   model.layers.{i}.block_sparse_moe.gate.weight    model.h.{i}.moe.router.weight
//   ...block_sparse_moe.experts.{e}.{w3,w1}.weight   model.h.{i}.moe.w_fc[e] ([C, 2H]: up (w3)
//                                                    columns, then gate (w1); transposed)
//   ...block_sparse_moe.experts.{e}.w2.weight        model.h.{i}.moe.w_proj[e] (transposed)
//   model.layers.{i}.mlp.gate.weight (Qwen 3 MoE)    model.h.{i}.moe.router.weight
//   ...mlp.experts.{e}.{up,gate}_proj.weight         model.h.{i}.moe.w_fc[e] (up columns, then gate)
//   ...mlp.experts.{e}.down_proj.weight              model.h.{i}.moe.w_proj[e] (transposed)
//   ...mlp.shared_expert.{up,gate}_proj.weight       model.h.{i}.moe.shared.c_fc.weight (up rows, then gate)
//   ...mlp.shared_expert.down_proj.weight            model.h.{i}.moe.shared.c_proj.weight
//   ...mlp.shared_expert_gate.weight                 model.h.{i}.moe.shared_gate.weight
//   ...mlp.experts.{gate_up_proj,down_proj}          the same, stacked as transformers 5 holds
//                                                    either family's experts in memory
//   (transformers 5's stacked mlp.gate.weight, mlp.experts.gate_up_proj [E, 2H, C] (gate rows,
//   then up) and mlp.experts.down_proj [E, C, H] are read too; export writes the per-expert names)
//   model.norm.weight                                model.ln_f.weight
//   lm_head.weight                                   model.lm_head.weight (untied; tied: must equal
//                                                    the embedding, or be absent)
// Rotary weights need no permutation: tessera rotates in the same "rotate half" layout (rotary.h).
#pragma once

#include <functional>
#include <map>
#include <string>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "model/model_options.h"

namespace tessera {

// Whether config.json's model_type is one this file imports (llama, mistral, mixtral, qwen2, qwen3).
bool is_hf_llama_family(const nlohmann::json& config);

// The model the config describes (vocab_multiple and dropout from `base`). Throws naming `source`
// and the key it cannot import.
ModelOptions llama_family_options_from_hf_config(const nlohmann::json& config, const ModelOptions& base,
                                                 const std::string& source);

// The folder's weights under tessera's export names for `opts` (its options from the config), as
// stored (dtype kept), one part at a time: the embedding (with an untied head; a saved tied head is
// checked against it), each block, then the final norm. Each tensor is read from its file when its
// part is made, so at most one part, and the folder's tensors it is made of, are held at once while
// `consume` may drop each part before the next (tessera import). Refuses a missing tensor naming
// it, and, after the last part, an unexpected one.
void read_hf_llama_parts(const std::string& dir, const ModelOptions& opts,
                         const std::function<void(std::map<std::string, at::Tensor>)>& consume);
// How many parts read_hf_llama_parts gives for `opts`: the ends, each block, the final norm.
inline int64_t hf_llama_part_count(const ModelOptions& opts) { return opts.n_layer + 2; }
// All the parts in one map (tests, and models small enough to hold whole).
std::map<std::string, at::Tensor> read_hf_llama_weights(const std::string& dir, const ModelOptions& opts);

// Whether `opts` is a model of the family that a Llama-family config describes exactly (what
// export writes): softmax attention with RMSNorm, rotary positions, SwiGLU, no biases but q, k, v
// ones, a dense feed-forward, Mixtral's experts in every block, Qwen 3 MoE's experts (with q/k
// norms) or Qwen2-MoE's (with q, k, v biases and a gated shared expert). The reason it is not, or "".
std::string hf_llama_family_refusal(const ModelOptions& opts);

// The config.json of `opts` (hf_llama_family_refusal empty): model_type qwen3_moe with experts and
// q/k norms, qwen2_moe with experts and q, k, v biases, mixtral with experts, qwen3 with q/k norms, qwen2 with q, k, v biases, llama otherwise.
nlohmann::json hf_llama_family_config(const ModelOptions& opts);

// Part `part` of the inverse of read_hf_llama_parts, under transformers' names: 0 the embedding
// (and an untied head), 1 to n_layer each block, n_layer + 1 the final norm; `get` gives a tensor
// of tessera's by its parameter name ("h.0.attn.c_attn.weight"; the embedding and an untied head
// cut to vocab_size rows), read as it is asked for (tessera export, part by part).
std::map<std::string, at::Tensor> hf_llama_family_part(const ModelOptions& opts, int64_t part,
                                                       const std::function<at::Tensor(const std::string&)>& get);
// The inverse of read_hf_llama_weights: tensors under tessera's export names (the embedding and
// an untied head cut to vocab_size rows) -> transformers' names.
std::map<std::string, at::Tensor> hf_llama_family_weights(const ModelOptions& opts,
                                                          const std::map<std::string, at::Tensor>& ours);

}  // namespace tessera
