// Dense MLP: GELU (gpt) or GLU with a SiLU gate (linear) (mlp.h).
#include "model/mlp.h"

#include <torch/torch.h>

#include "model/linear.h"
#include "model/norm.h"

namespace tessera {

MLPImpl::MLPImpl(const ModelOptions& opts) : glu_(opts.arch == "linear") {
  const int64_t C = opts.n_embd, H = opts.hidden();
  c_fc = register_module("c_fc", torch::nn::Linear(torch::nn::LinearOptions(C, glu_ ? 2 * H : H).bias(opts.bias)));
  c_proj = register_module("c_proj", torch::nn::Linear(torch::nn::LinearOptions(H, C).bias(opts.bias)));
  init_normal(c_fc->weight, 0.02);
  init_zero(c_fc->bias);
  init_normal(c_proj->weight, residual_std(opts.n_layer));
  init_zero(c_proj->bias);
}

at::Tensor MLPImpl::forward(const at::Tensor& x) {
  auto h = linear(c_fc, region_.input(x));
  if (glu_) {
    auto parts = h.chunk(2, -1);
    return region_.output(c_proj, parts[0] * at::silu(parts[1]));
  }
  return region_.output(c_proj, at::gelu(h, "tanh"));
}

}  // namespace tessera
