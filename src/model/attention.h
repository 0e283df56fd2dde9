// Causal multi-head softmax self-attention (arch gpt), GPT-2's or, through model options,
// Llama's, Qwen's and Mistral's (model_options.h):
//
//   q, k, v = projections of x                q [B, T, H d], k and v [B, T, K d]; K = n_kv_head
//   q, k -> RMSNorm over each head            qk_norm only (Qwen 3)
//   q, k -> rotated by their positions        position = rope only (rotary.h)
//   y = SDPA(q, k, v, causal)                 softmax(q k^T / sqrt(d)) v, each k and v head shared
//                                             by H / K query heads (SDPA's enable_gqa: nothing is
//                                             copied); dropout on the probabilities
//   out = c_proj(y)                           [B, T, C]
//
// The projections: c_attn [3C, C] (q, k, v blocks) where they are equal (fused_qkv(): GPT-2's
// layout and names), else q_proj [H d, C] and kv_proj [2 K d, C] (k, v blocks). Biases where
// model.bias or model.qkv_bias (on q, k, v only).
//
// The attention core (split, norms, rotation, SDPA, merge: qkv -> y) is what selective activation
// checkpointing recomputes in backward; set_checkpoint_core(true) turns that on.
//
// The kernel (q, k, v [B, h, T, d] -> y [B, h, T, d], causal, scale 1/sqrt(d), as many k and v heads
// as q heads: shared heads are repeated for it) is replaceable from outside: softmax sequence
// parallelism (parallel/sequence/softmax_attention_sp.h) installs one that communicates across
// the ranks holding the other chunks of the sequence, and sets each rank's position offset (the
// position of its first token) for the rotation. A kernel applies no dropout; it runs inside the
// core, so selective checkpointing recomputes it (and repeats its communication) in backward. An
// empty kernel restores SDPA.
//
// Tensor parallelism shards the layer from outside (set_region, model/sharded_region.h): c_attn
// (or q_proj and kv_proj) then holds this rank's heads' rows, block by block, and c_proj the
// matching input columns; the core works on however many heads the projections give it: H / N
// query heads, and K / N key/value heads, or, with fewer key/value heads than ranks, the one that
// those query heads share (kv_proj replicated over N / K ranks, model/parameter_spec.h).
#pragma once

#include <functional>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "core/random_streams.h"
#include "model/hook_slot.h"
#include "model/linear.h"
#include "model/model_options.h"
#include "model/norm.h"
#include "model/rotary.h"
#include "model/parameter_spec.h"
#include "model/sharded_region.h"

namespace tessera {

class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  CausalSelfAttentionImpl(const ModelOptions& opts, const at::TensorOptions& where);
  at::Tensor forward(const at::Tensor& x);  // [B, T, C] -> [B, T, C]
  void set_checkpoint_core(bool on) { checkpoint_core_ = on; }
  // The random stream of the attention-probability dropout (core/random_streams.h).
  void set_dropout_stream(random::Stream stream) { dropout_stream_ = stream; }
  // The position of the input's first token in its sequence (rotary positions; >= 0).
  void set_position_offset(int64_t offset) { position_offset_ = offset; }
  // c_attn column-parallel in three blocks (q, k, v), or q_proj in one and kv_proj in two (k, v);
  // c_proj row-parallel; the q and k norms replicated.
  ParameterSpecs parameter_specs() const;

  using Kernel = std::function<at::Tensor(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v)>;
  // One owner each (model/hook_slot.h): a second kernel or region is refused; an empty one clears.
  void set_kernel(Kernel kernel) { install_once(kernel_, std::move(kernel), "the attention kernel"); }
  void set_region(ShardedRegion region) { install_once(region_, std::move(region), "the layer's region"); }

  Linear c_attn{nullptr}, q_proj{nullptr}, kv_proj{nullptr}, c_proj{nullptr};
  Norm q_norm{nullptr}, k_norm{nullptr};  // qk_norm only

 private:
  // [B, T, (h + 2 k) d] (q, k, v) -> [B, T, h d]: the h query heads and k key/value heads this
  // rank computes (forward() reads them from the projections' shapes).
  at::Tensor core(const at::Tensor& qkv, int64_t h, int64_t kv);

  int64_t head_dim_;
  int64_t kv_heads_;  // the model's (n_kv_head)
  at::Tensor inv_freq_;  // rotary only (rotary.h), float32 on the CPU
  int64_t position_offset_ = 0;
  // The last tables, reused while the positions, device and dtype stay (every step's forward, and
  // its recomputation under checkpointing, asks for the same).
  RotaryTables rotary_;
  int64_t rotary_offset_ = -1;
  // The tables for `x` [B, h, T, d] at position_offset_.
  const RotaryTables& rotary_for(const at::Tensor& x);
  double residual_std_;
  double dropout_;
  random::Stream dropout_stream_ = random::Stream::shared;
  bool checkpoint_core_ = false;
  Kernel kernel_;
  ShardedRegion region_;
};
TORCH_MODULE(CausalSelfAttention);

}  // namespace tessera
