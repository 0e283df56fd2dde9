// The gradients a tensor-parallel rank holds only its share of after backward, and their sum over
// tp once a step (as Megatron's finalize_model_grads sums its sequence-parallel norms' gradients).
//
// Under Megatron-SP each parameter tp leaves whole and the sequence-split region uses (a block's
// norms, its row-parallel biases, ln_f's; an MoE layer's) sees only this rank's tokens, and a
// per-head one (Qwen 3's q/k norms) only this rank's heads (model/parameter_spec.h,
// gradient_summed_over_tp): its gradient on a rank after backward is that rank's share. The sum
// over tp is linear, so it may follow the micro-batches' accumulation and the reduction over the
// data replicas (with which it commutes): the optimizer owner (LocalOptimizer, DataParallel) sums
// the shares in finish_gradients, once a step, in one all-reduce of their concatenation. It runs
// where every tp rank is at the same point of its collectives (after the last backward; never
// from a gradient hook, whose timing would interleave it with the backward's own tp
// collectives). Until then a share is not the parameter's gradient: nothing reads it before
// finish_gradients (the clipping norm, the update and gradients() come after).
#pragma once

#include <set>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "comm/group.h"
#include "model/transformer.h"

namespace tessera {

struct GradientShares {
  comm::Group* tp = nullptr;     // null: no shares (tp = 1)
  std::set<std::string> names;   // the parameters whose gradients are shares, by name in the model

  bool any() const { return tp && !names.empty(); }
  bool holds(const std::string& name) const { return tp && names.count(name) > 0; }
  // Sums `shares` (this rank's; the same shapes in the same order on every tp rank) over tp in
  // place: one all-reduce of their float32 concatenation, none where they hold no element.
  void sum(const std::vector<at::Tensor>& shares) const;
};

// The shares of `model`, sharded over `tp` by parallelize_tensor (none with tp.size() == 1).
GradientShares gradient_shares(const TransformerLM& model, comm::Group& tp, bool megatron_sp);

}  // namespace tessera
