// Rotary position embedding (RoPE, Su et al. 2021), as Llama, Qwen and Mistral apply it: each
// head's vector is rotated by an angle proportional to its position, pairing dimension i with
// i + d/2 (the "rotate half" layout of Hugging Face's checkpoints, so imported q and k weights
// need no permutation):
//
//   inv_freq[j] = theta^(-2j / d)                      j = 0 .. d/2 - 1 (float32, as transformers)
//   angle[t, j] = position(t) * inv_freq[j];  cos, sin of cat(angle, angle)  [T, d]
//   rope(x) = x * cos + rotate_half(x) * sin          rotate_half(x) = cat(-x[d/2:], x[:d/2])
//
// Llama 3.1's long-context scaling (rope_scaling = llama3) divides the low frequencies (wavelength
// above rope_original_context / rope_low_freq_factor) by rope_factor, keeps the high ones
// (wavelength below rope_original_context / rope_high_freq_factor) and blends in between.
//
// Positions are absolute: a sequence-parallel rank holding tokens o .. o+T-1 of each sequence
// rotates them by those positions (attention.h, set_position_offset), so the sequence's ranks
// agree with one process.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "model/model_options.h"

namespace tessera {

// The inverse frequencies [d/2] (float32) of model options `o` with head width `o.head_width()`.
at::Tensor rotary_inverse_frequencies(const ModelOptions& o);

// cos and sin [T, d] of positions offset .. offset+T-1 (computed in float32, returned in `dtype` on
// `device`). `inv_freq` from rotary_inverse_frequencies, on any device.
struct RotaryTables {
  at::Tensor cos, sin;
};
RotaryTables rotary_tables(const at::Tensor& inv_freq, int64_t offset, int64_t T, const at::TensorOptions& options);

// x [B, h, T, d] rotated by `tables` (T rows). A float32 x on the CPU whose last dimension is
// contiguous goes through one fused autograd function (a pass over x forward and one over the
// gradient backward, keeping only the tables); its values and gradients are bit for bit those of
// apply_rotary_composite (the same products, rounded before the same sums). Other inputs (CUDA,
// bf16, whose composite rounds each product to bf16) take apply_rotary_composite.
at::Tensor apply_rotary(const at::Tensor& x, const RotaryTables& tables);
// The rotation as ATen's operations: rope(x) = x * cos + rotate_half(x) * sin, as written above.
at::Tensor apply_rotary_composite(const at::Tensor& x, const RotaryTables& tables);

}  // namespace tessera
