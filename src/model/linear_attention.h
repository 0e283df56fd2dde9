// Causal linear attention with per-head exponential decay (TransNormerLLM / Lightning Attention;
// papers.md §2.1-2.2), for arch = "linear".
//
// Per head h with decay λ = exp(-s_h) in (0, 1):   o_i = Σ_{j<=i} λ^{i-j} (q_i · k_j) v_j
// (no softmax, no normaliser). Slopes follow ALiBi: s_h = 2^{-8(h+1)/H} for H a power of two;
// otherwise the slopes of the nearest lower power of two n, followed by every other slope of 2n.
//
// The carried state. Both functions accept and return a state S [B, H, d_k, d_v] defined as the
// contribution of all earlier tokens to the position about to be processed, already decayed to it:
// S_in enters position 0 as o_i += λ^i q_i S_in, and S_out = λ^T S_in + Σ_j λ^{T-j} k_j^T v_j is what
// position T (the first one of the next segment) sees. This is LASP's KV (papers.md §2.2), so a
// sequence split into segments, each started from the previous one's final state, gives the
// same output as the whole sequence.
//
// Numerics: q, k, v and the state are computed in float32; decay powers are exp(log(λ) * distance)
// with distance >= 0, so every factor lies in (0, 1] and nothing is divided by λ^i. The output has
// q's dtype; the final state is float32.
#pragma once

#include <cstdint>
#include <functional>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include "model/hook_slot.h"
#include "model/linear.h"
#include "model/model_options.h"
#include "model/parameter_spec.h"
#include "model/sharded_region.h"

namespace tessera {

// The chunked (lightning) form: the sequence is cut into chunks of `chunk` tokens (the last may be
// shorter). Per chunk, local positions i, j in [0, c):
//   intra: O = ((Q K^T) ⊙ D) V,  D_ij = λ^{i-j} for i >= j, else 0   (left product, masked)
//   inter: O += (λ^i q_i) S                                         (right product with the state)
//   state: S <- λ^c S + Σ_j λ^{c-j} k_j^T v_j
// No step waits for the one before it: every chunk's intra term and k^T v sum is one batched
// product, and the state entering each chunk is one product with the matrix of decays between
// chunks (up to 256 chunks per product, the state carried between such groups), so the work is a
// few dozen kernels whatever T is (a loop over chunks ran ~15 small kernels per chunk: 56x slower
// than softmax attention on an H100 at 8K tokens, docs/gpu.md).
// q, k: [B, H, T, d_k]; v: [B, H, T, d_v]; decay: [H] (λ); returns [B, H, T, d_v].
at::Tensor lightning_attention_chunked(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                       const at::Tensor& decay, int64_t chunk,
                                       const at::Tensor& initial_state = {}, at::Tensor* final_state = nullptr);

// The token-by-token recurrence (reference; O(T) sequential steps):
//   s <- S_in;  for each i: s <- s + k_i^T v_i;  o_i = q_i s;  s <- λ s;   S_out = s.
at::Tensor linear_attention_recurrent(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      const at::Tensor& decay, const at::Tensor& initial_state = {},
                                      at::Tensor* final_state = nullptr);

// ALiBi slopes s_h, [H] float32 on the CPU.
at::Tensor alibi_slopes(int64_t n_head);

// The attention layer of a linear block:
//   q = silu(q_proj x), k = silu(k_proj x), v = v_proj x       -> [B, H, T, d]
//   o = lightning_attention_chunked(q, k, v, λ, model.linear_chunk)
//   o = rms_normalize(o) per head (no parameters)             -> [B, T, C]
//   out = o_proj(o * sigmoid(u_proj x))
// Selective checkpointing recomputes the core (stacked q, k, v -> normalised o).
//
// The kernel (q, k, v, λ, chunk -> o, shapes as lightning_attention_chunked's) is replaceable
// from outside: sequence parallelism (parallel/sequence/lasp.h) installs one that carries the
// state across ranks. An empty kernel restores lightning_attention_chunked.
//
// Tensor parallelism shards the layer from outside (set_region, model/sharded_region.h): q, k, v
// and u_proj then hold the rows of this rank's heads [first, first + count), o_proj the matching
// input columns, and select_heads(first, count) keeps those heads' decays.
class LinearAttentionImpl : public torch::nn::Module {
 public:
  using Kernel = std::function<at::Tensor(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                          const at::Tensor& decay, int64_t chunk)>;

  LinearAttentionImpl(const ModelOptions& opts, const at::TensorOptions& where);
  at::Tensor forward(const at::Tensor& x);  // [B, T, C] -> [B, T, C]
  void set_checkpoint_core(bool on) { checkpoint_core_ = on; }
  // q, k, v, u_proj column-parallel (this rank's heads), o_proj row-parallel.
  ParameterSpecs parameter_specs() const;
  // One owner each (model/hook_slot.h): a second kernel or region is refused; an empty one clears.
  void set_kernel(Kernel kernel) { install_once(kernel_, std::move(kernel), "the linear-attention kernel"); }
  void set_region(ShardedRegion region) { install_once(region_, std::move(region), "the layer's region"); }
  // The layer computes heads [first, first + count) of model.n_head only; throws when out of range.
  void select_heads(int64_t first, int64_t count);

  Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, u_proj{nullptr}, o_proj{nullptr};

 private:
  at::Tensor core(const at::Tensor& qkv);  // [3, B, H, T, d] -> [B, T, C]

  int64_t head_dim_, chunk_;
  double residual_std_;
  at::Tensor decay_;         // [H] float32 (H = this layer's heads) λ on the CPU (not a buffer: module dtype casts must not round it)
  at::Tensor decay_device_;  // decay_ on the device of the last input
  bool checkpoint_core_ = false;
  Kernel kernel_;
  ShardedRegion region_;
};
TORCH_MODULE(LinearAttention);

}  // namespace tessera
