// LayerNorm / RMSNorm (norm.h).
#include "model/norm.h"

#include <cmath>

#include <ATen/ATen.h>

#include "model/rms_norm.h"

namespace tessera {

NormImpl::NormImpl(NormKind kind, int64_t dim, bool bias, const at::TensorOptions& where, double eps)
    : kind_(kind), eps_(eps) {
  weight_ = register_parameter("weight", at::empty({dim}, where));
  if (kind == NormKind::layer && bias) bias_ = register_parameter("bias", at::empty({dim}, where));
}

at::Tensor NormImpl::forward(const at::Tensor& x) {
  if (kind_ == NormKind::layer) {
    auto y = at::layer_norm(x.to(at::kFloat), {x.size(-1)}, weight_.to(at::kFloat),
                            bias_.defined() ? bias_.to(at::kFloat) : at::Tensor(), eps_);
    return y.to(x.scalar_type());
  }
  // float32: one rms_norm with the weight inside (rms_norm.h: fused on the CPU); else Hugging
  // Face's order (normalize in float32, cast back, then the weight), which a cast in between makes
  // differ.
  if (x.scalar_type() == at::kFloat && weight_.scalar_type() == at::kFloat) return rms_norm(x, weight_, eps_);
  return (rms_normalize(x, eps_) * weight_).to(x.scalar_type());
}

at::Tensor NormImpl::for_matmul(const at::Tensor& x) {
  if (kind_ != NormKind::layer || !fused_layer_norm_applies(x, weight_)) return forward(x);
  return layer_norm_bf16(x, weight_, bias_, eps_);
}

NormedSum NormImpl::add_for_matmul(const at::Tensor& x, const at::Tensor& branch) {
  if (kind_ != NormKind::layer || !fused_layer_norm_applies(x, weight_) || branch.scalar_type() != at::kBFloat16 ||
      branch.sizes() != x.sizes()) {
    at::Tensor sum = x + branch;
    return {sum, forward(sum)};
  }
  return add_layer_norm_bf16(x, branch, weight_, bias_, eps_);
}

at::Tensor rms_normalize(const at::Tensor& x, double eps) {
  // rms_norm.h's without a weight: the weight is applied after the cast back, as Hugging Face's
  // Llama applies it.
  return rms_norm(x.to(at::kFloat), at::Tensor(), eps).to(x.scalar_type());
}

double residual_std(int64_t n_layer) { return 0.02 / std::sqrt(2.0 * static_cast<double>(n_layer)); }

}  // namespace tessera
