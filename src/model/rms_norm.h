// RMSNorm over the last dimension (Zhang and Sennrich 2019), as Llama, Qwen and Mistral apply it:
//
//   rstd = 1 / sqrt(mean(x^2) + eps)  per row        y = x * rstd * weight   (weight optional)
//   dx = rstd * (dy * weight) - x * rstd^3 * mean(dy * weight * x)
//   dweight = sum over rows of dy * x * rstd
//
// On the CPU in float32 ATen (torch 2.11) has a fused forward but differentiates the composite
// (pow, mean, add, rsqrt, two products): six saved tensors, among them a normalised copy of x, and
// a backward of a dozen passes, 1.3 ms against a forward's 0.15 at tiny_llama's [16, 128, 128]. A
// float32 x on the CPU whose last dimension is contiguous goes through one autograd function here
// instead: one pass over x forward, one over x and the gradient backward, keeping x, the weight and
// rstd (4 bytes a row) only. Its sums run in 16 float32 lanes, not in ATen's order, so its values
// differ from the composite's in the last bits: both are checked against float64
// (RmsNorm.TheFusedFunctionIsAsAccurateAsTheComposite). The weight's gradient is summed over fixed
// blocks of rows, then over the blocks in order: the same bits with any number of threads. In
// training and in evaluation alike (the same forward: the two modes agree bit for bit). Other
// inputs (CUDA; bf16 or fp16; a weight of another dtype) take ATen's rms_norm. Measured: the
// tiny_llama step 0.907x (bench/results/train_step_cpu_tiny_llama.md).
#pragma once

#include <ATen/core/Tensor.h>

namespace tessera {

// x [..., C], weight [C] or undefined (no weight).
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);
// ATen's rms_norm of the same arguments (the composite on the CPU under autograd).
at::Tensor rms_norm_aten(const at::Tensor& x, const at::Tensor& weight, double eps);

}  // namespace tessera
