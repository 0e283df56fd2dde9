// [model] options: the shape of the network, named presets, and its size and cost.
//
// Two architectures share one block layout (pre-norm residual blocks, tied output head):
//   arch = "gpt"    GPT-2: learned positions, LayerNorm, causal softmax attention, GELU MLP;
//   arch = "linear" TransNormerLLM / lightning attention: no positions, RMSNorm, causal linear
//                   attention with per-head decay, GLU MLP.
// ffn = "moe" replaces the MLP of every moe_every-th block (blocks moe_every-1, 2*moe_every-1, ...)
// with a mixture of experts: top-k of moe_experts (Switch top-1, GShard top-2, any k), softmax or
// sigmoid scores, capacity or dropless routing (model/moe.h).
//
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
  int64_t linear_chunk = 64;
  int64_t mlp_ratio = 4;

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
    v("block_size", block_size, "maximum sequence length", between(1, 1 << 22));
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
    v("linear_chunk", linear_chunk, "chunk length of lightning attention (arch linear)", between(1, 1 << 16));
    v("mlp_ratio", mlp_ratio, "MLP hidden width = mlp_ratio * n_embd", between(1, 64));
  }

  // Throws tessera::Error("<source>: model.<key> must be ... (got X)").
  void check(const std::string& source) const;

  int64_t head_dim() const { return n_embd / n_head; }
  int64_t padded_vocab() const { return (vocab_size + vocab_multiple - 1) / vocab_multiple * vocab_multiple; }
  int64_t hidden() const { return mlp_ratio * n_embd; }
  // Whether block `layer` (0-based) uses the MoE feed-forward.
  bool is_moe_block(int64_t layer) const { return ffn == "moe" && (layer + 1) % moe_every == 0; }

  // Throws tessera::Error("unknown model preset 'x' (model.preset); known: ...").
  static ModelOptions from_preset(const std::string& name);
  static std::vector<std::string> preset_names();
};


}  // namespace tessera
