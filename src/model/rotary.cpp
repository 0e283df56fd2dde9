// Rotary position embedding (rotary.h).
#include "model/rotary.h"

#include <algorithm>
#include <cmath>

#include <ATen/Parallel.h>
#include <torch/autograd.h>
#include <torch/autograd.h>

namespace tessera {

at::Tensor rotary_inverse_frequencies(const ModelOptions& o) {
  const int64_t d = o.head_width();
  at::Tensor inv = 1.0 / at::pow(o.rope_theta, at::arange(0, d, 2, at::kLong).to(at::kFloat) / static_cast<double>(d));
  if (o.rope_scaling != "llama3") return inv;
  const double context = static_cast<double>(o.rope_original_context);
  const double low_wavelength = context / o.rope_low_freq_factor, high_wavelength = context / o.rope_high_freq_factor;
  const at::Tensor wavelength = 2 * M_PI / inv;
  at::Tensor scaled = at::where(wavelength > low_wavelength, inv / o.rope_factor, inv);
  const at::Tensor smooth =
      (context / wavelength - o.rope_low_freq_factor) / (o.rope_high_freq_factor - o.rope_low_freq_factor);
  const at::Tensor blended = (1 - smooth) * scaled / o.rope_factor + smooth * scaled;
  const at::Tensor medium = (wavelength >= high_wavelength).logical_and(wavelength <= low_wavelength);
  return at::where(medium, blended, scaled);
}

RotaryTables rotary_tables(const at::Tensor& inv_freq, int64_t offset, int64_t T, const at::TensorOptions& options) {
  const at::Tensor positions = at::arange(offset, offset + T, options.dtype(at::kFloat));
  const at::Tensor angle = at::outer(positions, inv_freq.to(options.device(), at::kFloat));
  const at::Tensor both = at::cat({angle, angle}, -1);
  return {both.cos().to(options.dtype()), both.sin().to(options.dtype())};
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// out = x * cos + rotate_half(x) * sin (forward, `sign` +1) or its transpose, the gradient's
// rotation the other way (`sign` -1: x * cos + rotate_half^T(x * sin)), row by row of d values,
// each product rounded before the sum as ATen's two multiplications and addition round them.
// x and out: [B, h, T, d] of any strides with the last dimension's 1; cos and sin: [T, d]
// contiguous.
void rotate_rows(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& out, int sign) {
  const int64_t B = x.size(0), H = x.size(1), T = x.size(2), d = x.size(3), half = d / 2;
  const float* xp = x.const_data_ptr<float>();
  const float* cp = cos.const_data_ptr<float>();
  const float* sp = sin.const_data_ptr<float>();
  float* op = out.mutable_data_ptr<float>();
  const int64_t xb = x.stride(0), xh = x.stride(1), xt = x.stride(2);
  const int64_t ob = out.stride(0), oh = out.stride(1), ot = out.stride(2);
  at::parallel_for(0, B * H * T, std::max<int64_t>(1, 32768 / std::max<int64_t>(d, 1)), [&](int64_t first, int64_t end) {
    for (int64_t row = first; row < end; ++row) {
      const int64_t t = row % T, bh = row / T, b = bh / H, hd = bh % H;
      const float* xr = xp + b * xb + hd * xh + t * xt;
      float* o = op + b * ob + hd * oh + t * ot;
      const float* c = cp + t * d;
      const float* s = sp + t * d;
      if (sign > 0) {
        for (int64_t i = 0; i < half; ++i) o[i] = xr[i] * c[i] + -xr[i + half] * s[i];
        for (int64_t i = half; i < d; ++i) o[i] = xr[i] * c[i] + xr[i - half] * s[i];
      } else {
        for (int64_t i = 0; i < half; ++i) o[i] = xr[i] * c[i] + xr[i + half] * s[i + half];
        for (int64_t i = half; i < d; ++i) o[i] = xr[i] * c[i] + -(xr[i - half] * s[i - half]);
      }
    }
  });
}

// The rotation as one autograd function: one pass each way, and only the tables kept.
class Rotary : public torch::autograd::Function<Rotary> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
    ctx->save_for_backward({cos, sin});
    at::Tensor out = at::empty_like(x);
    rotate_rows(x, cos, sin, out, +1);
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor grad = grads[0].stride(-1) == 1 ? grads[0] : grads[0].contiguous();
    at::Tensor gx = at::empty_like(grad);
    rotate_rows(grad, saved[0], saved[1], gx, -1);
    return {gx, at::Tensor(), at::Tensor()};
  }
};

bool fused_rotary_applies(const at::Tensor& x, const RotaryTables& tables) {
  return x.device().is_cpu() && x.scalar_type() == at::kFloat && x.dim() == 4 && x.stride(3) == 1 &&
         x.size(3) % 2 == 0 && tables.cos.scalar_type() == at::kFloat && tables.sin.scalar_type() == at::kFloat &&
         tables.cos.is_contiguous() &&
         tables.sin.is_contiguous() && tables.cos.sizes() == at::IntArrayRef({x.size(2), x.size(3)}) &&
         tables.sin.sizes() == tables.cos.sizes() && !tables.cos.requires_grad() && !tables.sin.requires_grad();
}

}  // namespace

at::Tensor apply_rotary(const at::Tensor& x, const RotaryTables& tables) {
  if (fused_rotary_applies(x, tables)) return Rotary::apply(x, tables.cos, tables.sin);
  return apply_rotary_composite(x, tables);
}

at::Tensor apply_rotary_composite(const at::Tensor& x, const RotaryTables& tables) {
  const int64_t half = x.size(3) / 2;
  const at::Tensor rotated = at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * tables.cos + rotated * tables.sin;
}

}  // namespace tessera
