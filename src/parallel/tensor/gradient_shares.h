// The gradients a tensor-parallel rank holds only its share of after backward, and their sums
// once a step (as Megatron's finalize_model_grads sums its sequence-parallel norms' gradients).
//
// Two kinds of share (model/parameter_spec.h, tensor_parallel.h):
// - over tp: under Megatron-SP each parameter tp leaves whole and the sequence-split region uses (a
//   block's norms, its row-parallel biases, ln_f's; an MoE layer's) sees only this rank's tokens,
//   and a per-head one (Qwen 3's q/k norms) only this rank's heads (gradient_summed_over_tp);
// - over the key/value replicas: with fewer key/value heads than tp ranks, the ranks holding the
//   same head (kv_replica_ranks) each have only their query heads' part of its kv_proj gradient.
// Each sum is linear, so it may follow the micro-batches' accumulation and the reduction over the
// data replicas (with which it commutes): the optimizer owner (LocalOptimizer, DataParallel) sums
// the shares in finish_gradients, once a step, one all-reduce over each group of the float32
// concatenation of its shares, the groups in a fixed order. It runs where every rank is at the same
// point of its collectives (after the last backward; never from a gradient hook, whose timing
// would interleave it with the backward's own tp collectives). Until then a share is not the
// parameter's gradient: nothing reads it before finish_gradients (the clipping norm, the update and
// gradients() come after).
#pragma once

#include <set>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "comm/group.h"
#include "model/transformer.h"

namespace tessera {

struct GradientShares {
  // The parameters, by name in the model, whose gradients are shares over `group`.
  struct Sum {
    comm::Group* group = nullptr;
    std::set<std::string> names;
  };
  std::vector<Sum> sums;  // the same order on every rank; none without tensor parallelism

  bool any() const { return !sums.empty(); }
  bool holds(const std::string& name) const;
  // Sums each share of `shares` (this rank's, by parameter name; every rank of a group lists that
  // group's shares with the same shapes in the same order) over its group in place: per group one
  // all-reduce of their float32 concatenation, none where they hold no element.
  void sum(const std::vector<std::pair<std::string, at::Tensor>>& shares) const;
};

// The shares of `model`, sharded over `tp` by parallelize_tensor (none with tp.size() == 1);
// `kv_replicas` as parallelize_tensor takes it.
GradientShares gradient_shares(const TransformerLM& model, comm::Group& tp, bool megatron_sp,
                               comm::Group* kv_replicas = nullptr);

}  // namespace tessera
