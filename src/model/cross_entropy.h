// The language model's loss: mean cross-entropy of next-token logits.
//
//   cross_entropy_mean(logits [N, V], targets [N]) -> float32 scalar, the mean over the targets
//   that are not -1 (ignored positions), as at::cross_entropy_loss with Reduction::Mean.
//
// float32 logits: at::cross_entropy_loss itself. bf16 or fp16 logits (the head under autocast):
// the log-softmax runs in the logits' dtype (its kernels accumulate in float32, and it is what
// PyTorch's autocast runs on CUDA) and only the N log-probabilities of the targets are cast to
// float32 for the mean. PyTorch's autocast casts the whole [N, V] log-probability tensor to float32
// for nll_loss, and its gradient back: the same values, two more passes over the largest tensor of
// the step. tessera cast the logits to float32 before the log-softmax, which made the loss 12.9 of
// a 57 ms step of GPT-2 124M on an H100 (16 x 1024 tokens, docs/gpu.md). Autocast is off inside,
// so the dtypes above hold on every device.
#pragma once

#include <ATen/core/Tensor.h>

namespace tessera {

at::Tensor cross_entropy_mean(const at::Tensor& logits, const at::Tensor& targets);

}  // namespace tessera
