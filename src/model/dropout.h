// Dropout that costs nothing when it does nothing. torch::dropout in training mode draws a
// Bernoulli mask even for p = 0 on CPU; with p = 0 (the default for pre-training) this skips the
// call entirely, so the default path does no random draws and no extra multiply.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/functional/dropout.h>

namespace tessera {

inline at::Tensor dropout_if_active(const at::Tensor& x, double p, bool training) {
  return (p > 0 && training) ? torch::dropout(x, p, true) : x;
}

}  // namespace tessera
