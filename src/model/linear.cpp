// linear() (linear.h): at::linear, or on a GPU under bf16 autocast and under
// KeepFloatWeightsForBackward the float32-weight-gradient function.
#include "model/linear.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/autograd.h>

#include "precision/autocast.h"

namespace tessera {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Forward in 16 bits (x, weight and bias cast as autocast would; the weights and biases by
// cast_joined, precision/autocast.h, so a pipeline step's micro-batches share one copy); backward:
// the input gradient in 16 bits, the weight gradient and the bias gradient in float32, each split
// into the joined weights' rows (one weight: a list of one; no bias: none). Two ways:
//   float32 gradients (a GPU under bf16): the weight gradient as a float32 GEMM output, the bias
//   gradient summed into float32;
//   autocast's (KeepFloatWeightsForBackward elsewhere): the 16-bit GEMM and sum, widened, as
//   at::linear's backward and its casts' make them.
// Under KeepFloatWeightsForBackward the backward casts the float32 weights again instead of keeping
// the forward's copy: ZeRO-3's gathered weights are freed after the forward and gathered again into
// the same storage before the backward, so no 16-bit copy of the model stays between the two.
class LinearFp32WeightGrads : public torch::autograd::Function<LinearFp32WeightGrads> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, at::TensorList weights, at::TensorList biases,
                            at::ScalarType dtype, bool float_grads, bool keep_float_weights) {
    const at::Tensor x16 = x.to(dtype), w16 = cast_joined(weights, dtype);
    std::vector<at::Tensor> saved = {x16};
    if (keep_float_weights) {
      saved.insert(saved.end(), weights.begin(), weights.end());
    } else {
      saved.push_back(w16);
    }
    ctx->save_for_backward(saved);
    ctx->saved_data["rows"] = row_counts(weights);
    ctx->saved_data["bias"] = !biases.empty();
    ctx->saved_data["dtype"] = static_cast<int64_t>(dtype);
    ctx->saved_data["float_grads"] = float_grads;
    ctx->saved_data["keep_float_weights"] = keep_float_weights;
    return at::linear(x16, w16, biases.empty() ? at::Tensor() : cast_joined(biases, dtype));
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::ScalarType dtype = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
    const bool float_grads = ctx->saved_data["float_grads"].toBool();
    const at::Tensor& x16 = saved[0];
    const at::Tensor w16 = ctx->saved_data["keep_float_weights"].toBool()
                               ? cast_joined(at::TensorList(saved).slice(1), dtype)
                               : saved[1];
    const std::vector<int64_t> rows = ctx->saved_data["rows"].toIntVector();
    const bool bias = ctx->saved_data["bias"].toBool();
    const at::Tensor grad = grads[0].to(dtype);
    const int64_t out = w16.size(0), in = w16.size(1);
    const at::Tensor grad2 = grad.reshape({-1, out});
    const size_t n = rows.size();
    variable_list result(1 + n * (bias ? 2 : 1) + 3);  // none for dtype, float_grads, keep_float_weights
    if (ctx->needs_input_grad(0)) result[0] = at::matmul(grad, w16);
    bool weights_needed = false, biases_needed = false;
    for (size_t i = 0; i < n; ++i) {
      weights_needed = weights_needed || ctx->needs_input_grad(1 + i);
      biases_needed = biases_needed || (bias && ctx->needs_input_grad(1 + n + i));
    }
    if (weights_needed) {
      const at::Tensor x2 = x16.reshape({-1, in});
      const at::Tensor dw = float_grads ? float_accumulated_mm(grad2.t(), x2) : at::mm(grad2.t(), x2).to(at::kFloat);
      const std::vector<at::Tensor> parts = split_rows(dw, rows);
      for (size_t i = 0; i < n; ++i) result[1 + i] = parts[i];
    }
    if (biases_needed) {
      const at::Tensor db = float_grads ? grad2.sum(0, false, at::kFloat) : grad2.sum(0).to(at::kFloat);
      const std::vector<at::Tensor> parts = split_rows(db, rows);
      for (size_t i = 0; i < n; ++i) result[1 + n + i] = parts[i];
    }
    return result;
  }
};

thread_local int keep_float_weights_depth = 0;

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

KeepFloatWeightsForBackward::KeepFloatWeightsForBackward() { ++keep_float_weights_depth; }
KeepFloatWeightsForBackward::~KeepFloatWeightsForBackward() { --keep_float_weights_depth; }

at::Tensor linear_joined(const at::Tensor& x, at::TensorList weights, at::TensorList biases) {
  const bool training = weights[0].requires_grad() && at::GradMode::is_enabled();
  if (bf16_autocast_on_gpu(x, weights[0]) && training)
    return LinearFp32WeightGrads::apply(x, weights, biases, at::kBFloat16, true, keep_float_weights_depth > 0);
  // Under autocast the weights and biases in its dtype by cast_joined (autocast casts x).
  const at::ScalarType dtype = autocast_dtype_or(x.device().type(), weights[0].scalar_type());
  if (keep_float_weights_depth > 0 && training && dtype != weights[0].scalar_type())
    return LinearFp32WeightGrads::apply(x, weights, biases, dtype, false, true);
  return at::linear(x, cast_joined(weights, dtype), biases.empty() ? at::Tensor() : cast_joined(biases, dtype));
}

at::Tensor linear_fp32_weight_grads(const at::Tensor& x, at::TensorList weights, at::TensorList biases) {
  return LinearFp32WeightGrads::apply(x, weights, biases, at::kBFloat16, true, false);
}

}  // namespace tessera
