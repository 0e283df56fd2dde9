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

// Forward in bf16 (x, weight and bias cast as autocast would; the weight and bias by cast_weight,
// precision/autocast.h, so a pipeline step's micro-batches share one copy); backward: the input gradient in
// bf16, the weight gradient as a float32 GEMM output, the bias gradient summed into float32. A
// custom function takes no undefined input, so a layer without a bias calls the two-input forward.
class LinearFp32WeightGrads : public torch::autograd::Function<LinearFp32WeightGrads> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight) {
    return run(ctx, x, weight, at::Tensor());
  }
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& bias) {
    return run(ctx, x, weight, bias);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x16 = saved[0];
    const at::Tensor& w16 = saved[1];
    const at::Tensor grad = grads[0].to(at::kBFloat16);
    const int64_t out = w16.size(0), in = w16.size(1);
    const at::Tensor grad2 = grad.reshape({-1, out});
    variable_list result(ctx->saved_data["bias"].toBool() ? 3 : 2);
    if (ctx->needs_input_grad(0)) result[0] = at::matmul(grad, w16);
    if (ctx->needs_input_grad(1)) result[1] = float_accumulated_mm(grad2.t(), x16.reshape({-1, in}));
    if (result.size() == 3 && ctx->needs_input_grad(2)) result[2] = grad2.sum(0, false, at::kFloat);
    return result;
  }

 private:
  static at::Tensor run(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
    const at::Tensor x16 = x.to(at::kBFloat16), w16 = cast_weight(weight, at::kBFloat16);
    ctx->save_for_backward({x16, w16});
    ctx->saved_data["bias"] = bias.defined();
    return at::linear(x16, w16, bias.defined() ? cast_weight(bias, at::kBFloat16) : at::Tensor());
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
  if (bf16_autocast_on_gpu(x, weight) && weight.requires_grad() && at::GradMode::is_enabled())
    return linear_fp32_weight_grads(x, weight, bias);
  // Under autocast the weight and bias in its dtype by cast_weight (autocast casts x).
  const at::ScalarType dtype = autocast_dtype_or(x.device().type(), weight.scalar_type());
  return at::linear(x, cast_weight(weight, dtype), bias.defined() ? cast_weight(bias, dtype) : bias);
}

at::Tensor linear_fp32_weight_grads(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  return bias.defined() ? LinearFp32WeightGrads::apply(x, weight, bias) : LinearFp32WeightGrads::apply(x, weight);
}

}  // namespace tessera
