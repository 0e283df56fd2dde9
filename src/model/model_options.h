// [model] options: the shape of the network, named presets, and its size and cost.
//
// Two architectures share one block layout (pre-norm residual blocks):
//   arch = "gpt"    softmax attention: GPT-2 by default (learned positions, LayerNorm, GELU MLP,
//                   tied head); the block kinds below build the Llama, Qwen and Mistral families
//                   from the same code (docs/models.md);
//   arch = "linear" TransNormerLLM / lightning attention: no positions, RMSNorm, causal linear
//                   attention with per-head decay, GLU MLP.
// ffn = "moe" replaces the MLP of every moe_every-th block (blocks moe_every-1, 2*moe_every-1, ...,
// after the first moe_dense_layers) with a mixture of experts: top-k of moe_experts (Switch top-1,
// GShard top-2, Mixtral, any k), softmax or sigmoid scores, gates renormalized or not, capacity or
// dropless routing, experts of their own width (fine-grained), shared experts beside them
// (DeepSeek); the experts are SwiGLU where mlp = swiglu (Mixtral, DeepSeek), else GELU (model/moe.h).
//
// Block kinds, each its own key ("auto": what arch implies):
//   norm        layernorm (arch gpt) | rmsnorm (arch linear), with norm_eps
//   position    learned (gpt) | rope (rotary, rope_theta; rope_scaling = llama3 with its factors)
//               | none (linear)
//   mlp         gelu (gpt) | swiglu (linear): down(up(x) * silu(gate(x))), ffn_hidden wide
//               (0: mlp_ratio * n_embd)
//   n_kv_head   grouped-query attention: key/value heads, each shared by n_head / n_kv_head query
//               heads (0: n_head; 1: multi-query); head_dim (0: n_embd / n_head) may differ from
//               n_embd / n_head (Qwen 3)
//   qkv_bias    biases on the q, k, v projections alone (Qwen 2) when bias is false
//   qk_norm     RMSNorm over each head of q and k before the rotation (Qwen 3)
//   tie_embeddings  the head computes logits with the token embedding (GPT-2, small Qwen) or
//               with an lm_head of its own (Llama)
// Presets set shapes only; the loader applies model.preset first and explicit keys refine it.
//
// Vocabulary padding: the token embedding (and the tied head) has padded_vocab() rows, vocab_size
// rounded up to a multiple of vocab_multiple (Megatron's make-vocab-size-divisible-by, but
// independent of tp, so the model is the same at every layout: 50257 -> 50304 at 128). Token ids
// stay below vocab_size; the padded rows are trained as Megatron trains them (their logits are
// pushed down by the softmax), kept in tessera's own checkpoints so a resume is exact, cut off by
// `tessera export` and never sampled by `tessera generate`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>
#include "core/options.h"

namespace tessera {

struct ModelOptions {
  std::string preset;          // "" = none
  std::string arch = "gpt";    // gpt | linear
  int64_t vocab_size = 256;
  int64_t vocab_multiple = 128;
  int64_t n_layer = 4;
  int64_t n_head = 4;
  int64_t n_embd = 128;
  int64_t block_size = 128;    // maximum sequence length
  double dropout = 0.0;
  bool bias = true;
  std::string ffn = "dense";   // dense | moe
  int64_t moe_experts = 4;
  int64_t moe_top_k = 1;       // 1 = Switch, 2 = GShard, up to moe_experts
  std::string moe_score = "softmax";  // softmax | sigmoid (DeepSeek-V3)
  double moe_capacity_factor = 1.25;  // 0 = dropless
  double moe_aux_loss_coef = 0.01;
  std::string moe_aux_scope = "micro_batch";  // micro_batch | global (model/moe.h)
  double moe_z_loss_coef = 0.001;
  double moe_bias_update_rate = 0;  // aux-loss-free balancing (DeepSeek-V3); 0 = off
  int64_t moe_every = 1;
  int64_t moe_dense_layers = 0;     // the first blocks stay dense (DeepSeek's first_k_dense_replace)
  int64_t moe_ffn_hidden = 0;       // each expert's hidden width; 0: hidden() (fine-grained: smaller)
  int64_t moe_shared_experts = 0;   // experts every token runs, beside the routed ones (DeepSeek)
  bool moe_shared_gate = false;     // the shared experts' output times sigmoid(x . g) (Qwen2-MoE)
  std::string moe_gates = "auto";   // auto | renormalized | scores
  double moe_routed_scale = 1;      // the routed experts' output scaled (DeepSeek-V3: 2.5)
  int64_t moe_groups = 1;           // group-limited routing (DeepSeek-V3's n_group); 1 = off
  int64_t moe_topk_groups = 0;      // groups a token may route to (topk_group); 0 = all
  int64_t linear_chunk = 64;
  int64_t mlp_ratio = 4;
  std::string norm = "auto";      // auto | layernorm | rmsnorm
  double norm_eps = 1e-5;
  std::string position = "auto";  // auto | learned | rope | none
  double rope_theta = 10000;
  std::string rope_scaling = "none";  // none | llama3
  double rope_factor = 8;
  double rope_low_freq_factor = 1;
  double rope_high_freq_factor = 4;
  int64_t rope_original_context = 8192;
  std::string mlp = "auto";       // auto | gelu | swiglu
  int64_t ffn_hidden = 0;         // 0: mlp_ratio * n_embd
  int64_t n_kv_head = 0;          // 0: n_head
  int64_t head_dim = 0;           // 0: n_embd / n_head
  bool qkv_bias = false;
  bool qk_norm = false;
  bool tie_embeddings = true;

  template <class V>
  void visit(V& v) {
    v("preset", preset, "named model shape applied before the other keys (\"\" = none)");
    v("arch", arch, "gpt (softmax attention) or linear (lightning attention, TransNormerLLM)");
    v("vocab_size", vocab_size, "token vocabulary size", between(1, 1 << 24));
    v("vocab_multiple", vocab_multiple,
      "the embedding holds vocab_size rounded up to a multiple of this (1 = no padding; any tp then works)",
      between(1, 1 << 16));
    v("n_layer", n_layer, "transformer blocks", between(1, 1024));
    v("n_head", n_head, "attention heads per block", between(1, 1024));
    v("n_embd", n_embd, "model width (a multiple of n_head)", between(1, 1 << 17));
    v("block_size", block_size, "maximum sequence length", between(1, 1 << 25));
    v("dropout", dropout, "dropout on embeddings, attention probabilities and residual branches", fraction_below_one());
    v("bias", bias, "biases in linear layers and LayerNorms");
    v("ffn", ffn, "dense (MLP) or moe (mixture of experts)");
    v("moe_experts", moe_experts, "experts per MoE layer", between(1, 4096));
    v("moe_top_k", moe_top_k, "experts per token (1 = Switch, 2 = GShard; at most moe_experts)", between(1, 4096));
    v("moe_score", moe_score, "router scores: softmax, or sigmoid (DeepSeek-V3)");
    v("moe_capacity_factor", moe_capacity_factor,
      "expert capacity = ceil(top_k * tokens / experts * factor); 0 = dropless (every token processed)",
      between(0, 1024));
    v("moe_aux_loss_coef", moe_aux_loss_coef, "weight of the Switch load-balancing loss", between(0, 100));
    v("moe_aux_scope", moe_aux_scope,
      "tokens the load-balancing loss counts expert loads over: micro_batch (this rank's forward) or global "
      "(the same micro-batch of every data- and sequence-parallel rank: the loss does not change with dp or sp)");
    v("moe_z_loss_coef", moe_z_loss_coef, "weight of the router z-loss", between(0, 100));
    v("moe_bias_update_rate", moe_bias_update_rate,
      "aux-loss-free balancing: a per-expert selection bias moved by this much each step toward the mean load "
      "(DeepSeek-V3 uses 0.001; 0 = off)", between(0, 1));
    v("moe_every", moe_every, "every k-th block is MoE (blocks k-1, 2k-1, ...)", between(1, 1024));
    v("moe_dense_layers", moe_dense_layers, "the first this many blocks keep a dense MLP (DeepSeek: 1 or 3)",
      between(0, 1024));
    v("moe_ffn_hidden", moe_ffn_hidden, "hidden width of each expert (fine-grained experts: smaller than the "
      "MLP's); 0: the MLP's width", between(0, 1 << 20));
    v("moe_shared_experts", moe_shared_experts, "experts every token runs beside the routed ones (DeepSeek): one "
      "MLP moe_shared_experts * moe_ffn_hidden wide", between(0, 64));
    v("moe_shared_gate", moe_shared_gate, "scale the shared experts' output per token by sigmoid(x . g), g a "
      "learned vector (Qwen2-MoE's shared_expert_gate)");
    v("moe_gates", moe_gates, "the routed experts' weights: renormalized (the chosen scores divided by their sum: "
      "Mixtral, DeepSeek-V3), scores (the chosen scores as they are: Switch, DeepSeekMoE), or auto (renormalized "
      "when top_k > 1)");
    v("moe_routed_scale", moe_routed_scale, "factor on the routed experts' output (DeepSeek-V3's "
      "routed_scaling_factor 2.5)", between(0.001, 1000));
    v("moe_groups", moe_groups, "expert groups for group-limited routing (DeepSeek-V3's n_group): a token's "
      "experts come from its moe_topk_groups best groups, each scored by the sum of its two best experts' "
      "selection scores; 1: off", between(1, 1024));
    v("moe_topk_groups", moe_topk_groups, "groups a token may route to (DeepSeek-V3's topk_group); 0: all of "
      "moe_groups", between(0, 1024));
    v("linear_chunk", linear_chunk, "chunk length of lightning attention (arch linear)", between(1, 1 << 16));
    v("mlp_ratio", mlp_ratio, "MLP hidden width = mlp_ratio * n_embd (unless ffn_hidden is set)", between(1, 64));
    v("norm", norm, "auto (arch gpt: layernorm, linear: rmsnorm), layernorm or rmsnorm");
    v("norm_eps", norm_eps, "epsilon of every norm", between(1e-12, 1e-1));
    v("position", position, "auto (arch gpt: learned, linear: none), learned, rope (rotary) or none");
    v("rope_theta", rope_theta, "rotary base (Llama 3: 500000)", between(1, 1e12));
    v("rope_scaling", rope_scaling, "none, or llama3 (Llama 3.1's long-context frequency scaling)");
    v("rope_factor", rope_factor, "llama3 scaling: how much longer the context is than rope_original_context",
      between(1, 1024));
    v("rope_low_freq_factor", rope_low_freq_factor, "llama3 scaling: wavelengths above "
      "rope_original_context / this are divided by rope_factor", between(0.001, 1024));
    v("rope_high_freq_factor", rope_high_freq_factor, "llama3 scaling: wavelengths below "
      "rope_original_context / this are kept", between(0.001, 1024));
    v("rope_original_context", rope_original_context, "llama3 scaling: the context the model was trained at",
      between(1, 1 << 24));
    v("mlp", mlp, "auto (arch gpt: gelu, linear: swiglu), gelu or swiglu");
    v("ffn_hidden", ffn_hidden, "MLP (and expert) hidden width; 0: mlp_ratio * n_embd", between(0, 1 << 20));
    v("n_kv_head", n_kv_head, "key/value heads (grouped-query attention; 1: multi-query); 0: n_head",
      between(0, 1024));
    v("head_dim", head_dim, "width of each attention head; 0: n_embd / n_head", between(0, 4096));
    v("qkv_bias", qkv_bias, "biases on the q, k and v projections (Qwen 2) even where bias is false");
    v("qk_norm", qk_norm, "RMSNorm over each head of q and k (Qwen 3)");
    v("tie_embeddings", tie_embeddings, "the output head is the token embedding (false: an lm_head of its own)");
  }

  // Throws tessera::Error("<source>: model.<key> must be ... (got X)").
  void check(const std::string& source) const;

  int64_t head_width() const { return head_dim > 0 ? head_dim : n_embd / n_head; }
  int64_t kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  int64_t padded_vocab() const { return (vocab_size + vocab_multiple - 1) / vocab_multiple * vocab_multiple; }
  int64_t hidden() const { return ffn_hidden > 0 ? ffn_hidden : mlp_ratio * n_embd; }
  // The block kinds with "auto" resolved by arch.
  bool rms_norm() const { return norm == "auto" ? arch == "linear" : norm == "rmsnorm"; }
  bool swiglu() const { return mlp == "auto" ? arch == "linear" : mlp == "swiglu"; }
  bool learned_positions() const { return position == "auto" ? arch == "gpt" : position == "learned"; }
  bool rotary() const { return position == "rope"; }
  // The attention's q, k, v as one projection c_attn in three equal blocks (GPT-2's layout), or,
  // where they differ in width (grouped-query attention, a head width of its own) or q and k are
  // normed, q_proj beside kv_proj (k and v in two equal blocks).
  bool fused_qkv() const { return kv_heads() == n_head && head_width() * n_head == n_embd && !qk_norm; }
  // Whether block `layer` (0-based) uses the MoE feed-forward.
  bool is_moe_block(int64_t layer) const {
    return ffn == "moe" && layer >= moe_dense_layers && (layer + 1) % moe_every == 0;
  }
  int64_t expert_hidden() const { return moe_ffn_hidden > 0 ? moe_ffn_hidden : hidden(); }
  // Expert slots per routed token: top_k x the capacity factor (top_k dropless), filled or not.
  double expert_slots() const {
    return static_cast<double>(moe_top_k) * (moe_capacity_factor > 0 ? moe_capacity_factor : 1.0);
  }
  // SwiGLU experts only where mlp = swiglu is set (Mixtral, DeepSeek); "auto" keeps GELU experts for
  // both arches, as before SwiGLU experts existed, so arch linear's MoE models keep their shapes.
  bool swiglu_experts() const { return mlp == "swiglu"; }
  // Whether the routed gates are the chosen scores divided by their sum.
  // Experts a token may be routed to: those of its moe_topk_groups groups (all without groups).
  int64_t routable_experts() const {
    return moe_topk_groups == 0 ? moe_experts : moe_topk_groups * (moe_experts / moe_groups);
  }
  bool renormalized_gates() const { return moe_gates == "auto" ? moe_top_k > 1 : moe_gates == "renormalized"; }

  // Throws tessera::Error("unknown model preset 'x' (model.preset); known: ...").
  static ModelOptions from_preset(const std::string& name);
  static std::vector<std::string> preset_names();
};


}  // namespace tessera
