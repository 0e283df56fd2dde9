// The size of the optimizer state kept for one parameter, from its shape alone (a meta tensor
// will do): what the memory estimate (plan/memory_estimate.h) and the swap engine's host budget
// (plan/swap_cut.h) count. Every slot is float32: AdamW's exp_avg and exp_avg_sq; SGD's
// momentum_buffer (none without momentum); Adafactor's row and column factors of a matrix (the
// whole second moment of a vector) and its first moment when beta1 > 0. Step counters (a few bytes
// per tensor) and fp16's master copies are not counted.
#pragma once

#include <ATen/core/Tensor.h>

#include "optim/optim_options.h"

namespace tessera {

// Bytes of `optim`'s state for parameter `p`, of which this rank holds `share` (1 when whole,
// 1/tp when split by tensor parallelism); Adafactor's factors shrink with the same share.
double optimizer_state_bytes(const OptimOptions& optim, const at::Tensor& p, double share = 1.0);

}  // namespace tessera
