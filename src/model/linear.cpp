// linear() (linear.h): at::linear, or on a GPU under bf16 autocast the float32-weight-gradient
// function.
#include "model/linear.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/autograd.h>

#include "precision/autocast.h"

namespace tessera {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Forward in bf16 (x, weight and bias cast as autocast would; the weights and biases by cast_joined,
// precision/autocast.h, so a pipeline step's micro-batches share one copy); backward: the input
// gradient in bf16, the weight gradient as a float32 GEMM output, the bias gradient summed into
// float32, each split into the joined weights' rows (one weight: a list of one; no bias: none).
class LinearFp32WeightGrads : public torch::autograd::Function<LinearFp32WeightGrads> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, at::TensorList weights, at::TensorList biases) {
    const at::Tensor x16 = x.to(at::kBFloat16), w16 = cast_joined(weights, at::kBFloat16);
    ctx->save_for_backward({x16, w16});
    ctx->saved_data["rows"] = row_counts(weights);
    ctx->saved_data["bias"] = !biases.empty();
    return at::linear(x16, w16, biases.empty() ? at::Tensor() : cast_joined(biases, at::kBFloat16));
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x16 = saved[0];
    const at::Tensor& w16 = saved[1];
    const std::vector<int64_t> rows = ctx->saved_data["rows"].toIntVector();
    const bool bias = ctx->saved_data["bias"].toBool();
    const at::Tensor grad = grads[0].to(at::kBFloat16);
    const int64_t out = w16.size(0), in = w16.size(1);
    const at::Tensor grad2 = grad.reshape({-1, out});
    const size_t n = rows.size();
    variable_list result(1 + n * (bias ? 2 : 1));
    if (ctx->needs_input_grad(0)) result[0] = at::matmul(grad, w16);
    bool weights_needed = false, biases_needed = false;
    for (size_t i = 0; i < n; ++i) {
      weights_needed = weights_needed || ctx->needs_input_grad(1 + i);
      biases_needed = biases_needed || (bias && ctx->needs_input_grad(1 + n + i));
    }
    if (weights_needed) {
      const at::Tensor dw = float_accumulated_mm(grad2.t(), x16.reshape({-1, in}));
      const std::vector<at::Tensor> parts = split_rows(dw, rows);
      for (size_t i = 0; i < n; ++i) result[1 + i] = parts[i];
    }
    if (biases_needed) {
      const at::Tensor db = grad2.sum(0, false, at::kFloat);
      const std::vector<at::Tensor> parts = split_rows(db, rows);
      for (size_t i = 0; i < n; ++i) result[1 + n + i] = parts[i];
    }
    return result;
  }
};

}  // namespace

at::Tensor float_accumulated_mm(const at::Tensor& a, const at::Tensor& b) {
  return a.is_cuda() ? at::mm(a, b, at::kFloat) : at::mm(a, b).to(at::kFloat);
}

bool bf16_autocast_on_gpu(const at::Tensor& x, const at::Tensor& weight) {
  return x.is_cuda() && at::autocast::is_autocast_enabled(at::kCUDA) &&
         at::autocast::get_autocast_dtype(at::kCUDA) == at::kBFloat16 && weight.scalar_type() == at::kFloat;
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  if (bias.defined()) return linear_joined(x, {weight}, {bias});
  return linear_joined(x, {weight}, {});
}

at::Tensor linear_joined(const at::Tensor& x, at::TensorList weights, at::TensorList biases) {
  if (bf16_autocast_on_gpu(x, weights[0]) && weights[0].requires_grad() && at::GradMode::is_enabled())
    return LinearFp32WeightGrads::apply(x, weights, biases);
  // Under autocast the weights and biases in its dtype by cast_joined (autocast casts x).
  const at::ScalarType dtype = autocast_dtype_or(x.device().type(), weights[0].scalar_type());
  return at::linear(x, cast_joined(weights, dtype), biases.empty() ? at::Tensor() : cast_joined(biases, dtype));
}

at::Tensor linear_fp32_weight_grads(const at::Tensor& x, at::TensorList weights, at::TensorList biases) {
  return LinearFp32WeightGrads::apply(x, weights, biases);
}

}  // namespace tessera
