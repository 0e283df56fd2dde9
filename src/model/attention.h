// Causal multi-head softmax self-attention of GPT-2 (arch gpt).
//
//   qkv = c_attn(x)                       [B, T, 3C], in q, k, v order along the last dim
//   q, k, v -> [B, H, T, d]               d = C / H
//   y = SDPA(q, k, v, causal)             softmax(q k^T / sqrt(d)) v, dropout on the probabilities
//   out = c_proj(y)                       [B, T, C]
//
// The attention core (split, SDPA, merge: qkv -> y) is what selective activation checkpointing
// recomputes in backward; set_checkpoint_core(true) turns that on.
//
// The kernel (q, k, v [B, H, T, d] -> y [B, H, T, d], causal, scale 1/sqrt(d)) is replaceable from
// outside: softmax sequence parallelism (parallel/sequence/softmax_attention_sp.h) installs one
// that communicates across the ranks holding the other chunks of the sequence. A kernel applies
// no dropout; it runs inside the core, so selective checkpointing recomputes it (and repeats its
// communication) in backward. An empty kernel restores SDPA.
//
// Tensor parallelism shards the layer from outside (set_region, model/sharded_region.h): c_attn
// then holds the q, k and v rows of this rank's heads (in that order) and c_proj the matching input
// columns; the core works on however many heads of d = n_embd / n_head the projection gives it.
#pragma once

#include <functional>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "core/random_streams.h"
#include "model/hook_slot.h"
#include "model/linear.h"
#include "model/model_options.h"
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
  // c_attn column-parallel in three blocks (q, k, v), c_proj row-parallel.
  ParameterSpecs parameter_specs() const;

  using Kernel = std::function<at::Tensor(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v)>;
  // One owner each (model/hook_slot.h): a second kernel or region is refused; an empty one clears.
  void set_kernel(Kernel kernel) { install_once(kernel_, std::move(kernel), "the attention kernel"); }
  void set_region(ShardedRegion region) { install_once(region_, std::move(region), "the layer's region"); }

  Linear c_attn{nullptr}, c_proj{nullptr};

 private:
  at::Tensor core(const at::Tensor& qkv);  // [B, T, 3 h d] -> [B, T, h d], h heads (n_head unsharded)

  int64_t head_dim_;
  double residual_std_;
  double dropout_;
  random::Stream dropout_stream_ = random::Stream::shared;
  bool checkpoint_core_ = false;
  Kernel kernel_;
  ShardedRegion region_;
};
TORCH_MODULE(CausalSelfAttention);

}  // namespace tessera
