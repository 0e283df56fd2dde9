// The transformer block and its checkpointing modes (block.h).
#include "model/block.h"

#include <torch/types.h>

#include "memory/saved_activations.h"
#include "model/dropout.h"

namespace tessera {

BlockImpl::BlockImpl(const ModelOptions& opts, int64_t layer, const at::TensorOptions& where)
    : dropout_(opts.dropout) {
  const bool linear = opts.arch == "linear";
  const NormKind norm = opts.rms_norm() ? NormKind::rms : NormKind::layer;
  ln_1 = register_module("ln_1", Norm(norm, opts.n_embd, opts.bias, where, opts.norm_eps));
  if (linear) linear_attn = register_module("attn", LinearAttention(opts, where));
  else softmax_attn = register_module("attn", CausalSelfAttention(opts, where));
  ln_2 = register_module("ln_2", Norm(norm, opts.n_embd, opts.bias, where, opts.norm_eps));
  if (opts.is_moe_block(layer)) moe = register_module("moe", MoE(opts, where));
  else mlp = register_module("mlp", MLP(opts, where));
}

ParameterSpecs BlockImpl::parameter_specs() const {
  ParameterSpecs specs;
  add_specs(specs, "ln_1", ln_1->parameter_specs());
  add_specs(specs, "attn", softmax_attn ? softmax_attn->parameter_specs() : linear_attn->parameter_specs());
  add_specs(specs, "ln_2", ln_2->parameter_specs());
  if (moe) add_specs(specs, "moe", moe->parameter_specs());
  else add_specs(specs, "mlp", mlp->parameter_specs());
  return specs;
}

void BlockImpl::set_checkpoint_mode(CheckpointMode mode) {
  mode_ = mode;
  if (softmax_attn) softmax_attn->set_checkpoint_core(mode == CheckpointMode::selective);
  if (linear_attn) linear_attn->set_checkpoint_core(mode == CheckpointMode::selective);
}

void BlockImpl::set_dropout_streams(const DropoutStreams& streams) {
  streams_ = streams;
  if (softmax_attn) softmax_attn->set_dropout_stream(streams.attention);
}

BlockOutput BlockImpl::run(const at::Tensor& x) {
  auto h = ln_1->for_matmul(x);
  auto a = dropout_if_active(softmax_attn ? softmax_attn(h) : linear_attn(h), dropout_, is_training(), streams_.residual);
  if (moe) {  // the router reads ln_2's output in float32
    auto y = x + a;
    auto out = moe(ln_2(y));
    return {y + dropout_if_active(out.y, dropout_, is_training(), streams_.residual), out.aux_loss};
  }
  auto [y, h2] = ln_2->add_for_matmul(x, a);
  return {y + dropout_if_active(mlp(h2), dropout_, is_training(), streams_.residual), torch::zeros({}, x.options().dtype(at::kFloat))};
}

BlockOutput BlockImpl::forward(const at::Tensor& x, const std::shared_ptr<ActivationOffload>& held) {
  SavedActivationScope saving(codec_, *this, offload_ ? offload_ : held, x, core_codec_, adaptive_.get(),
                              adaptive_block_);
  BlockOutput out;
  if (mode_ != CheckpointMode::full || !checkpoint_applies(x)) {
    out = run(x);
  } else {
    auto o = checkpoint(
        [this](const TensorList& in) {
          auto r = run(in[0]);
          return TensorList{r.x, r.aux_loss};
        },
        TensorList{x});
    out = {o[0], o[1]};
  }
  saving.ended(out.x);
  return out;
}

}  // namespace tessera
