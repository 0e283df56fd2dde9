// Applying a torch::nn::Linear the way PyTorch's nn.Linear does: through at::linear.
//
// The C++ frontend's LinearImpl::forward (torch::nn::functional::linear) computes
// x.matmul(W^T) followed by a separate `+= bias` for inputs of more than 2 dims. at::linear, which
// Python's nn.Linear calls, folds a contiguous [B, T, in] input into one addmm with the bias inside
// the GEMM. Same math; per biased layer one elementwise pass over the output and one autograd node
// fewer, and the op list of a step matches the PyTorch peer's (docs/benchmarks.md). Every Linear
// of the model files is applied through this function, never through its module's forward.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/linear.h>
#include <torch/nn/modules/linear.h>

namespace tessera {

// x: [..., in] -> [..., out]
inline at::Tensor linear(const torch::nn::Linear& layer, const at::Tensor& x) {
  return at::linear(x, layer->weight, layer->bias);
}

}  // namespace tessera
