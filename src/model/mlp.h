// The dense feed-forward of a block (model.ffn = dense), hidden width H (model.hidden()).
//   mlp gelu:   out = c_proj(gelu_tanh(c_fc x))              c_fc: C -> H
//   mlp swiglu: a, g = split(c_fc x); out = c_proj(a * silu(g))   c_fc: C -> 2H (GLU; a first: Llama's
//               up_proj, then its gate_proj); the gate is one autograd function
//               (model/swiglu.h), which keeps only c_fc's output for its backward
// Tensor parallelism shards it from outside (set_region, model/sharded_region.h): c_fc then holds
// this rank's hidden units (for the GLU its a rows, then the matching g rows) and c_proj the
// matching input columns.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "model/hook_slot.h"
#include "model/linear.h"
#include "model/model_options.h"
#include "model/parameter_spec.h"
#include "model/sharded_region.h"

namespace tessera {

class MLPImpl : public torch::nn::Module {
 public:
  MLPImpl(const ModelOptions& opts, const at::TensorOptions& where);
  at::Tensor forward(const at::Tensor& x);  // [B, T, C] -> [B, T, C]
  // One owner (model/hook_slot.h): a second region is refused; an empty one clears.
  void set_region(ShardedRegion region) { install_once(region_, std::move(region), "the MLP's region"); }
  // c_fc column-parallel (the GLU's in two blocks, a and g), c_proj row-parallel.
  ParameterSpecs parameter_specs() const;

  Linear c_fc{nullptr}, c_proj{nullptr};

 private:
  bool glu_;
  double residual_std_;
  ShardedRegion region_;
};
TORCH_MODULE(MLP);

}  // namespace tessera
