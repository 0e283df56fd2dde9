// Linear and Embedding layers whose parameters are created empty on a given device (the meta
// device included) and initialised from their declarations (model/parameter_spec.h,
// model/init.h), never by the layer itself.
//
// A Linear is applied the way PyTorch's nn.Linear is: through at::linear, which folds a
// contiguous [B, T, in] input into one addmm with the bias inside the GEMM (the C++ frontend's
// Linear adds the bias in a separate pass; docs/benchmarks.md). Every Linear of the model files is
// applied through linear(), so the op list of a step matches the PyTorch peer's.
//
// One exception, on a GPU under bf16 autocast with float32 weights that need gradients: there
// linear() is one autograd function (linear.cpp) whose forward is at::linear's in bf16 and whose
// weight and bias gradients leave their GEMM and reduction in float32 (cuBLAS's float32 output of
// bf16 inputs, the bias sum accumulated into float32), as Megatron's gradient-accumulation fusion
// does. Under at::linear they are rounded to bf16 and then cast to float32 by one kernel per
// parameter (122 per GPT-2 124M step, 1.5 ms of 41.7 on an H200: bench/results/gpu_first_runs.md).
// The input gradient is bf16 either way. The gradients differ from at::linear's by that one bf16
// rounding, which they no longer have. Under KeepFloatWeightsForBackward (below) the same function
// runs on every device under autocast, with at::linear's gradients off a GPU.
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

// x: [..., in] -> [..., out]; weight [out, in], bias [out] or undefined. Under autocast the weight
// and bias are cast by cast_weight (precision/autocast.h: one copy for a pipeline step's held
// micro-batches).
at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);
// The float32-weight-gradient function itself, on any device (tests run it on the CPU, where its
// weight gradient is the bf16 GEMM's, widened), for one weight or several joined (biases: one
// per weight, or none).
at::Tensor linear_fp32_weight_grads(const at::Tensor& x, at::TensorList weights, at::TensorList biases);
inline at::Tensor linear(const Linear& layer, const at::Tensor& x) { return linear(x, layer->weight, layer->bias); }
// While one lives on a thread, linear() and linear_joined() in training under autocast keep the
// float32 weights for their backward and cast them again there, instead of keeping the forward's
// 16-bit copy (linear.cpp; the gradients are at::linear's, or on a GPU under bf16 the float32
// weight-gradient function's). ZeRO-3 holds one around a block's forward (parallel/data/zero3.cpp):
// its gathered weights are freed after the forward and gathered again into the same storage
// before the backward, and a kept copy would hold the whole model in 16 bits on every rank until
// the backward.
class KeepFloatWeightsForBackward {
 public:
  KeepFloatWeightsForBackward();
  ~KeepFloatWeightsForBackward();
  KeepFloatWeightsForBackward(const KeepFloatWeightsForBackward&) = delete;
  KeepFloatWeightsForBackward& operator=(const KeepFloatWeightsForBackward&) = delete;
};
// One product for several linears of the same input: their weights (and biases, all or none)
// joined along the output dimension, [..., in] -> [..., sum of outs], as linear() applies one
// (under a pipeline step's WeightCastCache one bf16 copy of the join for all its micro-batches).
at::Tensor linear_joined(const at::Tensor& x, at::TensorList weights, at::TensorList biases);
// a @ b of bf16 (or fp16) matrices accumulated into a float32 result: one GEMM on a GPU, the
// 16-bit product widened elsewhere (the CPU has no such GEMM). The weight gradient of the
// float32-weight-gradient function, and of tp_comm.h's sequence_gathered_linear.
at::Tensor float_accumulated_mm(const at::Tensor& a, const at::Tensor& b);
// Whether x is on a GPU under bf16 autocast with float32 `weight`: where linear() runs the
// float32-weight-gradient function and Norm the fused layer norm (model/fused_layer_norm.h).
bool bf16_autocast_on_gpu(const at::Tensor& x, const at::Tensor& weight);

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
