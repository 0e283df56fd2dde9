// Causal softmax self-attention (attention.h).
#include "model/attention.h"

#include <torch/torch.h>

#include "memory/activation_checkpointing.h"
#include "model/linear.h"
#include "model/norm.h"

namespace tessera {

ParameterSpecs CausalSelfAttentionImpl::parameter_specs() const {
  ParameterSpecs specs = column_linear("c_attn", 0.02, 3);
  add_specs(specs, row_linear("c_proj", residual_std_));
  return specs;
}

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const ModelOptions& opts, const at::TensorOptions& where)
    : head_dim_(opts.head_dim()), residual_std_(residual_std(opts.n_layer)), dropout_(opts.dropout) {
  const int64_t C = opts.n_embd;
  c_attn = register_module("c_attn", Linear(C, 3 * C, opts.bias, where));
  c_proj = register_module("c_proj", Linear(C, C, opts.bias, where));
}

at::Tensor CausalSelfAttentionImpl::core(const at::Tensor& qkv) {
  const int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3;
  auto heads = [&](const at::Tensor& t) { return t.view({B, T, C / head_dim_, head_dim_}).transpose(1, 2); };
  auto parts = qkv.split(C, -1);
  const double p = is_training() ? dropout_ : 0.0;
  auto y = kernel_ ? kernel_(heads(parts[0]), heads(parts[1]), heads(parts[2]))
                   : random::fork(p > 0 ? dropout_stream_ : random::Stream::shared, qkv.device(), [&] {
                       return at::scaled_dot_product_attention(heads(parts[0]), heads(parts[1]), heads(parts[2]),
                                                               {}, p, /*is_causal=*/true);
                     });
  return y.transpose(1, 2).contiguous().view({B, T, C});
}

at::Tensor CausalSelfAttentionImpl::forward(const at::Tensor& x) {
  auto qkv = linear(c_attn, region_.input(x));
  auto y = checkpoint_core_ && checkpoint_applies(qkv) ? checkpoint([this](const at::Tensor& t) { return core(t); }, qkv)
                                                    : core(qkv);
  return region_.output(c_proj, y);
}

}  // namespace tessera
