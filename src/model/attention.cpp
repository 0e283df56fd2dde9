// Causal softmax self-attention (attention.h).
#include "model/attention.h"

#include <ATen/ATen.h>

#include "memory/activation_checkpointing.h"
#include "memory/saved_activations.h"
#include "model/linear.h"
#include "model/norm.h"
#include "model/rotary.h"

namespace tessera {

ParameterSpecs CausalSelfAttentionImpl::parameter_specs() const {
  ParameterSpecs specs;
  if (c_attn) {
    specs = column_linear("c_attn", 0.02, 3);
  } else {
    specs = column_linear("q_proj", 0.02, 1);
    add_specs(specs, column_linear("kv_proj", 0.02, 2, kv_heads_));
  }
  if (q_norm) {
    ParameterSpecs norms = q_norm->parameter_specs();
    for (auto& [name, spec] : norms) spec.per_head = true;
    add_specs(specs, "q_norm", norms);
    add_specs(specs, "k_norm", norms);
  }
  add_specs(specs, row_linear("c_proj", residual_std_));
  return specs;
}

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const ModelOptions& opts, const at::TensorOptions& where)
    : head_dim_(opts.head_width()),
      kv_heads_(opts.kv_heads()),
      residual_std_(residual_std(opts.n_layer)),
      dropout_(opts.dropout) {
  const int64_t C = opts.n_embd, q_width = opts.n_head * head_dim_, kv_width = opts.kv_heads() * head_dim_;
  const bool qkv_bias = opts.bias || opts.qkv_bias;
  if (opts.fused_qkv()) {
    c_attn = register_module("c_attn", Linear(C, 3 * C, qkv_bias, where));
  } else {
    q_proj = register_module("q_proj", Linear(C, q_width, qkv_bias, where));
    kv_proj = register_module("kv_proj", Linear(C, 2 * kv_width, qkv_bias, where));
  }
  if (opts.qk_norm) {
    q_norm = register_module("q_norm", Norm(NormKind::rms, head_dim_, false, where, opts.norm_eps));
    k_norm = register_module("k_norm", Norm(NormKind::rms, head_dim_, false, where, opts.norm_eps));
  }
  c_proj = register_module("c_proj", Linear(q_width, C, opts.bias, where));
  if (opts.rotary()) inv_freq_ = rotary_inverse_frequencies(opts);
}

at::Tensor CausalSelfAttentionImpl::core(const at::Tensor& qkv, int64_t h, int64_t kv) {
  const AttentionCoreSaving saving;  // memory.attention_compression (memory/saved_activations.h)
  const int64_t B = qkv.size(0), T = qkv.size(1), d = head_dim_, group = h / kv;
  // [B, T, (h + 2 kv) d] -> q [B, T, h, d], k and v [B, T, kv, d]: one split, whose backward writes
  // the three gradients into one tensor. Three narrows would each zero-fill a whole qkv gradient and
  // copy into it: 36 fills and 36 strided copies, 2.0 ms of a GPT-2 124M batch-16 step on an H200
  // (bench/results/gpu_session49_h200.md).
  const std::vector<at::Tensor> parts = qkv.split_with_sizes({h * d, kv * d, kv * d}, -1);
  at::Tensor q = parts[0].view({B, T, h, d}), k = parts[1].view({B, T, kv, d}), v = parts[2].view({B, T, kv, d});
  if (q_norm) {
    q = q_norm(q);
    k = k_norm(k);
  }
  q = q.transpose(1, 2);
  k = k.transpose(1, 2);
  v = v.transpose(1, 2);
  if (inv_freq_.defined()) {
    const RotaryTables& tables = rotary_for(q);
    q = apply_rotary(q, tables);
    k = apply_rotary(k, tables);
  }
  if (group > 1 && kernel_) {  // the sequence-parallel kernels take as many key/value heads as query heads
    k = k.repeat_interleave(group, 1);
    v = v.repeat_interleave(group, 1);
  }
  const double p = is_training() ? dropout_ : 0.0;
  auto y = kernel_ ? kernel_(q, k, v)
                   : random::fork(p > 0 ? dropout_stream_ : random::Stream::shared, qkv.device(), [&] {
                       return at::scaled_dot_product_attention(q, k, v, {}, p, /*is_causal=*/true, std::nullopt,
                                                               /*enable_gqa=*/group > 1);
                     });
  return y.transpose(1, 2).contiguous().view({B, T, h * d});
}

const RotaryTables& CausalSelfAttentionImpl::rotary_for(const at::Tensor& x) {
  const int64_t T = x.size(2);
  const bool same = rotary_.cos.defined() && rotary_offset_ == position_offset_ && rotary_.cos.size(0) == T &&
                    rotary_.cos.device() == x.device() && rotary_.cos.scalar_type() == x.scalar_type();
  if (!same) {
    rotary_ = rotary_tables(inv_freq_, position_offset_, T, x.options());
    rotary_offset_ = position_offset_;
  }
  return rotary_;
}

at::Tensor CausalSelfAttentionImpl::forward(const at::Tensor& x) {
  const int64_t h = (c_attn ? c_attn->weight.size(0) / 3 : q_proj->weight.size(0)) / head_dim_;
  const int64_t kv = c_attn ? h : kv_proj->weight.size(0) / (2 * head_dim_);
  // q_proj and kv_proj as one GEMM: their weights (and biases) joined, a copy of C x (H + 2K) d
  // numbers instead of one of the B T (H + 2K) d outputs (under bf16 in a pipeline step, one copy
  // for all its micro-batches: linear_joined).
  auto qkv = c_attn ? region_.project(c_attn, x)
             : q_proj->bias.defined()
                 ? region_.project_joined(x, {q_proj->weight, kv_proj->weight}, {q_proj->bias, kv_proj->bias})
                 : region_.project_joined(x, {q_proj->weight, kv_proj->weight}, {});
  auto y = checkpoint_core_ && checkpoint_applies(qkv)
               ? checkpoint([this, h, kv](const at::Tensor& t) { return core(t, h, kv); }, qkv)
               : core(qkv, h, kv);
  return region_.output(c_proj, y);
}

}  // namespace tessera
