// Dropout that costs nothing when it does nothing, drawing from a chosen random stream.
//
// torch::dropout in training mode draws a Bernoulli mask even for p = 0 on CPU; with p = 0 (the
// default for pre-training) this skips the call entirely, so the default path does no random draws
// and no extra multiply. With p > 0 the mask comes from `stream` (core/random_streams.h): the
// shared stream for activations every tensor-parallel rank holds whole, the model-parallel stream
// for activations split across them.
//
// On the CPU ATen's dropout keeps its mask for the backward as a tensor of x's dtype (4 bytes an
// element in float32); `dropout` here makes the same draw (bernoulli_(1 - p) into a tensor like x,
// divided by 1 - p, times x: ATen's values and gradients bit for bit) and keeps the mask as bool,
// 1 byte an element, which every activation codec packs to 1/8 (memory/activation_codec.h). On
// CUDA ATen's fused dropout already keeps a bool mask; it runs there as it is.
#pragma once

#include <ATen/core/Tensor.h>

#include "core/random_streams.h"

namespace tessera {

// Which stream each dropout site of a block draws from. On one process (and under data or
// sequence parallelism) both are shared; parallelize() switches the sites whose activations
// tensor parallelism splits (parallel/parallelize.h). The embedding's dropout acts before the
// blocks, on activations every tp rank holds whole, and always draws from the shared stream.
struct DropoutStreams {
  random::Stream attention = random::Stream::shared;  // the attention probabilities (a rank's heads under tp)
  random::Stream residual = random::Stream::shared;   // sublayer outputs added to the residual stream
};

// Training-mode dropout of x with probability p in (0, 1), drawing from the current generator.
at::Tensor dropout(const at::Tensor& x, double p);

inline at::Tensor dropout_if_active(const at::Tensor& x, double p, bool training,
                                    random::Stream stream = random::Stream::shared) {
  if (!(p > 0 && training)) return x;
  return random::fork(stream, x.device(), [&] { return dropout(x, p); });
}

}  // namespace tessera
