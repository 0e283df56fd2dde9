// set_gradient_ready_hook (gradient_ready_hook.h) over torch's PostAccumulateGradHook.
#include "core/gradient_ready_hook.h"

#include <memory>
#include <utility>

#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

namespace tessera {
namespace {

struct GradientReady : torch::autograd::PostAccumulateGradHook {
  explicit GradientReady(std::function<void()> fn) : fn(std::move(fn)) {}
  void operator()(const torch::autograd::Variable&) override { fn(); }
  std::function<void()> fn;
};

}  // namespace

void set_gradient_ready_hook(const at::Tensor& param, std::function<void()> ready) {
  torch::autograd::impl::set_post_acc_grad_hooks(
      param, ready ? std::make_unique<GradientReady>(std::move(ready)) : nullptr);
}

}  // namespace tessera
