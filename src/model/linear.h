// Linear and Embedding layers whose parameters are created empty on a given device (the meta
// device included) and initialised from their declarations (model/parameter_spec.h,
// model/init.h), never by the layer itself.
//
// A Linear is applied the way PyTorch's nn.Linear is: through at::linear, which folds a
// contiguous [B, T, in] input into one addmm with the bias inside the GEMM (the C++ frontend's
// Linear adds the bias in a separate pass; docs/benchmarks.md). Every Linear of the model files is
// applied through linear(), so the op list of a step matches the PyTorch peer's.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>
#include <ATen/ops/embedding.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/linear.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

namespace tessera {

class LinearImpl : public torch::nn::Module {
 public:
  LinearImpl(int64_t in, int64_t out, bool bias, const at::TensorOptions& where) {
    weight = register_parameter("weight", at::empty({out, in}, where));
    if (bias) this->bias = register_parameter("bias", at::empty({out}, where));
  }
  at::Tensor weight;  // [out, in]
  at::Tensor bias;    // [out], undefined without a bias
};
TORCH_MODULE(Linear);

// x: [..., in] -> [..., out]
inline at::Tensor linear(const Linear& layer, const at::Tensor& x) { return at::linear(x, layer->weight, layer->bias); }

class EmbeddingImpl : public torch::nn::Module {
 public:
  EmbeddingImpl(int64_t count, int64_t dim, const at::TensorOptions& where) {
    weight = register_parameter("weight", at::empty({count, dim}, where));
  }
  at::Tensor forward(const at::Tensor& idx) { return at::embedding(weight, idx); }  // [...] -> [..., dim]
  at::Tensor weight;  // [count, dim]
};
TORCH_MODULE(Embedding);

}  // namespace tessera
