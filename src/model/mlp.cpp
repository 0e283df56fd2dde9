// Dense MLP: GELU (gpt) or GLU with a SiLU gate (linear) (mlp.h).
#include "model/mlp.h"

#include <ATen/ATen.h>

#include "model/linear.h"
#include "model/norm.h"
#include "model/swiglu.h"

namespace tessera {

ParameterSpecs MLPImpl::parameter_specs() const {
  ParameterSpecs specs = column_linear("c_fc", 0.02, glu_ ? 2 : 1);
  add_specs(specs, row_linear("c_proj", residual_std_));
  return specs;
}

MLPImpl::MLPImpl(const ModelOptions& opts, const at::TensorOptions& where)
    : glu_(opts.swiglu()), residual_std_(residual_std(opts.n_layer)) {
  const int64_t C = opts.n_embd, H = opts.hidden();
  c_fc = register_module("c_fc", Linear(C, glu_ ? 2 * H : H, opts.bias, where));
  c_proj = register_module("c_proj", Linear(H, C, opts.bias, where));
}

at::Tensor MLPImpl::forward(const at::Tensor& x) {
  auto h = region_.project(c_fc, x);
  if (glu_) return region_.output(c_proj, swiglu(h));
  return region_.output(c_proj, at::gelu(h, "tanh"));
}

}  // namespace tessera
