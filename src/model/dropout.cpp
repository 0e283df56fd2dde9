// Dropout with a bool mask on the CPU (dropout.h).
#include "model/dropout.h"

#include <torch/autograd.h>
#include <torch/autograd.h>
#include <torch/types.h>

namespace tessera {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// x * noise, noise = bernoulli(1 - p) / (1 - p) as ATen's CPU dropout draws and scales it
// (aten/src/ATen/native/Dropout.cpp, _dropout_impl); keeps noise != 0 and the kept value.
class BoolMaskDropout : public torch::autograd::Function<BoolMaskDropout> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& noise,
                            const at::Tensor& kept) {
    ctx->save_for_backward({noise.ne(0), kept});
    return x * noise;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor noise = at::where(saved[0], saved[1], at::zeros({}, saved[1].options()));
    return {grads[0] * noise, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor dropout(const at::Tensor& x, double p) {
  if (!x.device().is_cpu() || !(p > 0 && p < 1) || x.numel() == 0) return torch::dropout(x, p, true);
  // The value a kept element's noise takes: 1 / (1 - p) in x's dtype, divided as ATen divides the
  // noise (a tensor wide enough for its vectorised loop and a tail; every element must agree, or
  // the mask could not stand for the noise: ATen's dropout then runs).
  const at::Tensor probe = at::ones({67}, x.options()).div_(1 - p);
  const at::Tensor kept = probe[0].clone();
  if (!probe.eq(kept).all().item<bool>()) return torch::dropout(x, p, true);
  at::Tensor noise = at::empty_like(x).bernoulli_(1 - p);
  noise.div_(1 - p);
  return BoolMaskDropout::apply(x, noise, kept);
}

}  // namespace tessera
