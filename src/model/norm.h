// Normalisation layers, and the GPT-2 residual initialisation scale shared by the model files.
//
// Norm is LayerNorm (model.norm layernorm: weight, and bias when model.bias) or RMSNorm
// (rmsnorm: weight only; y = x / sqrt(mean(x^2) + eps) * weight), eps model.norm_eps, so that every
// architecture keeps the module names ln_1, ln_2, ln_f and their parameters "weight" / "bias".
// Normalisation statistics are computed in float32 and the result is cast back to x's dtype.
// RMSNorm runs rms_norm.h's function (one fused autograd function for float32 on the CPU).
//
// for_matmul and add_for_matmul are for a norm whose output only feeds a matrix product: where
// fused_layer_norm_applies (a LayerNorm on a GPU under bf16 autocast) they run the fused kernels
// of fused_layer_norm.h and return the bf16 the product would have cast the output to; elsewhere
// they are forward(x) and {x + branch, forward(x + branch)}.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "model/fused_layer_norm.h"
#include "model/parameter_spec.h"

namespace tessera {

constexpr double kNormEps = 1e-5;

enum class NormKind { layer, rms };

class NormImpl : public torch::nn::Module {
 public:
  NormImpl(NormKind kind, int64_t dim, bool bias, const at::TensorOptions& where, double eps = kNormEps);
  at::Tensor forward(const at::Tensor& x);  // [..., C] -> [..., C]
  at::Tensor for_matmul(const at::Tensor& x);
  NormedSum add_for_matmul(const at::Tensor& x, const at::Tensor& branch);  // {x + branch, its norm}
  ParameterSpecs parameter_specs() const {  // replicated; unit weight, zero bias
    return {{"weight", {Split::replicated, 1, ones_init()}}, {"bias", {}}};
  }

 private:
  NormKind kind_;
  double eps_;
  at::Tensor weight_, bias_;  // [C]; bias_ undefined for RMSNorm or model.bias = false
};
TORCH_MODULE(Norm);

// Per-row RMS normalisation without parameters over the last dimension (float32 statistics).
at::Tensor rms_normalize(const at::Tensor& x, double eps = kNormEps);

// std of residual output projections: 0.02 / sqrt(2 * n_layer) (GPT-2 paper, §2.3).
double residual_std(int64_t n_layer);

}  // namespace tessera
