// SwiGLU's gate as one autograd function (swiglu.h).
#include "model/swiglu.h"

#include <torch/autograd.h>

#include "core/error.h"

namespace tessera {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

struct SwiGLUFunction : public torch::autograd::Function<SwiGLUFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& h) {
    ctx->save_for_backward({h});
    const std::vector<at::Tensor> parts = h.chunk(2, -1);
    return parts[0] * at::silu(parts[1]);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const at::Tensor h = ctx->get_saved_variables()[0];
    const at::Tensor& dy = grads[0];
    const int64_t H = h.size(-1) / 2;
    const std::vector<at::Tensor> parts = h.chunk(2, -1);
    at::Tensor dh = at::empty_like(h, at::MemoryFormat::Contiguous);
    at::Tensor du = dh.narrow(-1, 0, H), dg = dh.narrow(-1, H, H);
    at::silu_backward_out(dg, dy * parts[0], parts[1]);
    at::mul_out(du, dy, at::silu(parts[1]));
    return {dh};
  }
};

}  // namespace

at::Tensor swiglu(const at::Tensor& h) {
  require(h.size(-1) % 2 == 0, "internal: SwiGLU's joined projection has an odd width ", h.size(-1));
  return SwiGLUFunction::apply(h);
}

}  // namespace tessera
