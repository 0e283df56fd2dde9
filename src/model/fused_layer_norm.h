// Layer norm fused with the bf16 cast of its output and, in a residual block, with the residual
// add before it: what torch.compile fuses in the same block, as one autograd function.
//
// Under bf16 autocast the residual stream is float32 and a layer norm's output is cast to bf16 by
// the matrix product that reads it. Composed from ATen ops, the block's `y = x + a; h = ln(y)`
// is four kernels forward (add, layer norm, its statistics inside, the cast) and five backward
// (cast of the incoming bf16 gradient, the input-gradient kernel, the separate weight and bias
// reduction, the residual add of the two gradients of y, the cast of a's gradient to bf16), each
// reading and writing the whole [rows, C] activation. The fused kernels (fused_layer_norm.cu)
// read each input once and write each output once: forward x (float32) and a (bf16) in, y
// (float32) and h (bf16) out; backward h's and y's gradients and y in, x's gradient (float32) and
// a's (bf16) out, with dw and db summed from per-warp partials (no atomics: the same result every
// run). Measured: a GPT-2 124M step at batch 64 on an H100 1.10x faster
// (bench/results/gpu_fused_kernels_h100.md).
//
// Numerics: the add, the statistics and the affine map are float32 as in at::layer_norm (two-pass
// mean and variance instead of Welford: the outputs agree to float32 rounding, then are rounded to
// bf16 once, as the product's cast would). Gradients are float32 throughout; a's is rounded to
// bf16, as autograd rounds it to a's dtype.
//
// Where it runs: fused_layer_norm_applies(). Norm (norm.h) uses it for the norms that feed a bf16
// product (ln_1, ln_2 of a dense block, ln_f before the head); elsewhere it runs the composite.
// layer_norm_bf16 and add_layer_norm_bf16 themselves run on any device: off the GPU (or in a build
// without CUDA) both directions are computed by the same formulas from ATen ops, which is what the
// CPU tests check the autograd function with and what the GPU test checks the kernels against.
#pragma once

#include <ATen/core/Tensor.h>

namespace tessera {

struct NormedSum {
  at::Tensor sum;     // x + branch, float32
  at::Tensor normed;  // layer_norm(sum) * weight + bias, bf16
};

// x float32 [..., C], weight and bias float32 [C] (bias may be undefined): the bf16 layer norm.
at::Tensor layer_norm_bf16(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, double eps);
// x float32 and branch bf16 of one shape [..., C]: {x + branch, its bf16 layer norm}.
NormedSum add_layer_norm_bf16(const at::Tensor& x, const at::Tensor& branch, const at::Tensor& weight,
                              const at::Tensor& bias, double eps);

// Whether the fused kernels run for x: a build with CUDA, x on a CUDA device under bf16 autocast,
// x and weight float32, and C (x's last dimension) at most kernels::kFusedLayerNormMaxWidth.
bool fused_layer_norm_applies(const at::Tensor& x, const at::Tensor& weight);

}  // namespace tessera
