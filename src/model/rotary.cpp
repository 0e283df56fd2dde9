// Rotary position embedding (rotary.h).
#include "model/rotary.h"

#include <cmath>

#include <torch/torch.h>

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

at::Tensor apply_rotary(const at::Tensor& x, const RotaryTables& tables) {
  const int64_t half = x.size(3) / 2;
  const at::Tensor rotated = at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * tables.cos + rotated * tables.sin;
}

}  // namespace tessera
