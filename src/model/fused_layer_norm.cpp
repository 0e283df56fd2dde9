// The fused layer norm's autograd function, and its formulas from ATen ops for every device the
// kernels do not run on (fused_layer_norm.h).
#include "model/fused_layer_norm.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include "core/error.h"
#include "model/fused_layer_norm_kernels.h"
#include "model/linear.h"

#if TESSERA_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

namespace tessera {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct Statistics {
  at::Tensor out, mean, rstd;  // out bf16, x's shape; mean, rstd float32, x's shape without C
};

bool on_kernels(const at::Tensor& t) {
#if TESSERA_WITH_CUDA
  return t.is_cuda();
#else
  return false;
#endif
}

// Forward of x [..., C] (contiguous) plus branch (bf16, x's shape) when not empty: {the sum (undefined
// without a branch), the statistics of the normalised input}. b may be empty (no bias).
std::pair<at::Tensor, Statistics> forward_rows(const at::Tensor& x, const at::Tensor& branch, const at::Tensor& w,
                                               const at::Tensor& b, double eps) {
  const bool with_branch = branch.numel() > 0;
#if TESSERA_WITH_CUDA
  if (on_kernels(x)) {
    const int64_t C = x.size(-1), rows = x.numel() / C;
    at::Tensor sum = with_branch ? at::empty_like(x) : at::Tensor();
    const auto stat_shape = x.sizes().slice(0, x.dim() - 1);
    Statistics st{at::empty_like(x, x.options().dtype(at::kBFloat16)), at::empty(stat_shape, x.options()),
                  at::empty(stat_shape, x.options())};
    kernels::layer_norm_forward(x.data_ptr<float>(), with_branch ? branch.data_ptr() : nullptr, w.data_ptr<float>(),
                                b.numel() > 0 ? b.data_ptr<float>() : nullptr,
                                with_branch ? sum.data_ptr<float>() : nullptr, st.out.data_ptr(),
                                st.mean.data_ptr<float>(), st.rstd.data_ptr<float>(), rows, static_cast<int>(C),
                                static_cast<float>(eps), at::cuda::getCurrentCUDAStream().stream());
    return {sum, st};
  }
#endif
  at::Tensor sum = with_branch ? x + branch.to(at::kFloat) : at::Tensor();
  const at::Tensor& s = with_branch ? sum : x;
  const at::Tensor mean = s.mean(-1, /*keepdim=*/true);
  const at::Tensor centred = s - mean;
  const at::Tensor rstd = at::rsqrt(centred.pow(2).mean(-1, /*keepdim=*/true) + eps);
  at::Tensor out = centred * rstd * w;
  if (b.numel() > 0) out = out + b;
  return {sum, {out.to(at::kBFloat16), mean.squeeze(-1), rstd.squeeze(-1)}};
}

struct Gradients {
  at::Tensor dx, dbranch, dw, db;  // dbranch undefined unless asked for
};

// dout bf16 and s (the normalised input, float32) of one shape [..., C], contiguous; dsum the sum's
// own gradient (float32) or undefined.
Gradients backward_rows(const at::Tensor& dout, const at::Tensor& s, const at::Tensor& mean, const at::Tensor& rstd,
                        const at::Tensor& w, const at::Tensor& dsum, bool want_branch) {
  const int64_t C = s.size(-1);
#if TESSERA_WITH_CUDA
  if (on_kernels(s)) {
    const int64_t rows = s.numel() / C;
    const int parts = kernels::layer_norm_backward_parts(rows);
    Gradients g{at::empty_like(s), want_branch ? at::empty_like(s, s.options().dtype(at::kBFloat16)) : at::Tensor(),
                at::Tensor(), at::Tensor()};
    const at::Tensor dw_parts = at::empty({parts, C}, s.options()), db_parts = at::empty({parts, C}, s.options());
    kernels::layer_norm_backward(dout.data_ptr(), s.data_ptr<float>(), mean.data_ptr<float>(), rstd.data_ptr<float>(),
                                 w.data_ptr<float>(), dsum.defined() ? dsum.data_ptr<float>() : nullptr,
                                 g.dx.data_ptr<float>(), want_branch ? g.dbranch.data_ptr() : nullptr,
                                 dw_parts.data_ptr<float>(), db_parts.data_ptr<float>(), rows, static_cast<int>(C),
                                 at::cuda::getCurrentCUDAStream().stream());
    g.dw = dw_parts.sum(0);
    g.db = db_parts.sum(0);
    return g;
  }
#endif
  const at::Tensor d = dout.to(at::kFloat), r = rstd.unsqueeze(-1);
  const at::Tensor xhat = (s - mean.unsqueeze(-1)) * r;
  const at::Tensor g = d * w;
  at::Tensor dx = r * (g - g.mean(-1, true) - xhat * (g * xhat).mean(-1, true));
  if (dsum.defined()) dx = dx + dsum;
  return {dx, want_branch ? dx.to(at::kBFloat16) : at::Tensor(), (d * xhat).reshape({-1, C}).sum(0),
          d.reshape({-1, C}).sum(0)};
}

// Inputs: x float32, branch bf16 (empty: none), weight, bias (empty: none), eps. Outputs: {sum,
// normed} with a branch, {normed} without. A custom function takes no undefined input, hence the
// empty tensors for "none".
class FusedLayerNorm : public torch::autograd::Function<FusedLayerNorm> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& branch,
                               const at::Tensor& weight, const at::Tensor& bias, double eps) {
    const bool with_branch = branch.numel() > 0;
    const at::Tensor xc = x.contiguous();
    auto [sum, st] = forward_rows(xc, with_branch ? branch.contiguous() : branch, weight.contiguous(),
                                  bias.contiguous(), eps);
    ctx->saved_data["with_branch"] = with_branch;
    ctx->saved_data["bias"] = bias.numel() > 0;
    ctx->save_for_backward({with_branch ? sum : xc, weight, st.mean, st.rstd});
    if (!with_branch) return {st.out};
    return {sum, st.out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &s = saved[0], &weight = saved[1], &mean = saved[2], &rstd = saved[3];
    const bool with_branch = ctx->saved_data["with_branch"].toBool();
    const at::Tensor& dnormed = with_branch ? grads[1] : grads[0];
    const at::Tensor dout = dnormed.defined() ? dnormed.to(at::kBFloat16).contiguous()
                                              : at::zeros_like(s, s.options().dtype(at::kBFloat16));
    const at::Tensor dsum = with_branch && grads[0].defined() ? grads[0].to(at::kFloat).contiguous() : at::Tensor();
    const bool want_branch = with_branch && ctx->needs_input_grad(1);
    Gradients g = backward_rows(dout, s, mean, rstd, weight.contiguous(), dsum, want_branch);
    variable_list out(5);
    out[0] = g.dx;
    if (want_branch) out[1] = g.dbranch;
    if (ctx->needs_input_grad(2)) out[2] = g.dw;
    if (ctx->saved_data["bias"].toBool() && ctx->needs_input_grad(3)) out[3] = g.db;
    return out;
  }
};

at::Tensor none_like(const at::Tensor& t, at::ScalarType type) { return at::empty({0}, t.options().dtype(type)); }

}  // namespace

at::Tensor layer_norm_bf16(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, double eps) {
  require(x.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat,
          "internal: layer_norm_bf16 takes float32 x and weight");
  return FusedLayerNorm::apply(x, none_like(x, at::kBFloat16), weight,
                               bias.defined() ? bias : none_like(weight, at::kFloat), eps)[0];
}

NormedSum add_layer_norm_bf16(const at::Tensor& x, const at::Tensor& branch, const at::Tensor& weight,
                              const at::Tensor& bias, double eps) {
  require(x.scalar_type() == at::kFloat && branch.scalar_type() == at::kBFloat16 && weight.scalar_type() == at::kFloat,
          "internal: add_layer_norm_bf16 takes float32 x and weight and a bf16 branch");
  require(x.sizes() == branch.sizes(), "internal: add_layer_norm_bf16 of ", x.sizes(), " and ", branch.sizes());
  auto out = FusedLayerNorm::apply(x, branch, weight, bias.defined() ? bias : none_like(weight, at::kFloat), eps);
  return {out[0], out[1]};
}

bool fused_layer_norm_applies(const at::Tensor& x, const at::Tensor& weight) {
  return on_kernels(x) && bf16_autocast_on_gpu(x, weight) && x.scalar_type() == at::kFloat && x.dim() > 0 &&
         x.size(-1) <= kernels::kFusedLayerNormMaxWidth;
}

}  // namespace tessera
