// The language model's loss: mean cross-entropy of next-token logits.
//
//   cross_entropy_mean(logits [N, V], targets [N]) -> float32 scalar, the mean over the targets
//   that are not -1 (ignored positions), as at::cross_entropy_loss with Reduction::Mean.
//
// float32 logits: at::cross_entropy_loss itself. bf16 or fp16 logits (the head under autocast),
// autocast off inside so that these dtypes hold on every device:
// - on a GPU (a build with CUDA): two fused kernels (cross_entropy_kernels.h). The forward reads
//   the logits once and keeps each row's logsumexp; the backward reads them once more and writes
//   their gradient, softmax minus one-hot, scaled by the row's loss gradient. The math is float32
//   from the 16-bit logits, as PyTorch's autocast computes the loss on its float32 copy of them.
//   Composed from ATen ops the same loss writes the [N, V] log-probabilities, fills a [N, V] zero
//   gradient to scatter the targets' into, and reads both back in the softmax backward: 16.6 ms of
//   the 138.5 ms of device time of a GPT-2 124M step at batch 64 on an H100, against 6.7 ms fused
//   (bench/results/gpu_fused_kernels_h100.md).
// - elsewhere: the log-softmax in the logits' dtype (its kernels accumulate in float32), and only
//   the N log-probabilities of the targets cast to float32 for the mean; not a float32 copy of the
//   whole log-probability tensor and its gradient, two more passes over the largest tensor of the
//   step.
#pragma once

#include <ATen/core/Tensor.h>

namespace tessera {

at::Tensor cross_entropy_mean(const at::Tensor& logits, const at::Tensor& targets);

}  // namespace tessera
