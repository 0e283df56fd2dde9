// Vocabulary-parallel embedding lookup and cross-entropy (vocab_parallel.h).
#include "parallel/tensor/vocab_parallel.h"

#include <torch/autograd.h>
#include <torch/autograd.h>

#include "core/error.h"
#include "parallel/tensor/tp_comm.h"

namespace tessera {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The loss of vocab_parallel.h with its own backward: the forward's all-reduces give every rank
// the row statistics, after which each rank's gradient is local.
struct VocabParallelCrossEntropy : public torch::autograd::Function<VocabParallelCrossEntropy> {
  // logits [P, V/N], targets [P]
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits, const at::Tensor& targets,
                            comm::Group* tp, int64_t ignore_index) {
    const int64_t local_vocab = logits.size(1), start = tp->rank() * local_vocab;
    at::Tensor z = logits.to(at::kFloat);
    at::Tensor row_max = std::get<0>(z.detach().max(1)).contiguous();  // [P]
    tp->all_reduce(row_max, comm::ReduceOp::max);
    at::Tensor shifted = z - row_max.unsqueeze(1);  // [P, V/N], <= 0 at the global maximum

    at::Tensor valid = targets != ignore_index;
    at::Tensor hit = valid & (targets >= start) & (targets < start + local_vocab);  // target column is here
    at::Tensor local_target = (targets - start).masked_fill(hit.logical_not(), 0);  // [P], 0 where not hit
    at::Tensor target_logit = shifted.gather(1, local_target.unsqueeze(1)).squeeze(1).masked_fill(hit.logical_not(), 0);
    at::Tensor exp = shifted.exp();
    at::Tensor sum_exp = exp.sum(1);
    tp->all_reduce(std::vector<at::Tensor>{sum_exp, target_logit});

    at::Tensor per_position = (sum_exp.log() - target_logit).masked_fill(valid.logical_not(), 0);
    const at::Tensor count = valid.sum().to(at::kFloat);
    ctx->save_for_backward({exp.div_(sum_exp.unsqueeze(1)), local_target, hit, valid, count});
    ctx->saved_data["dtype"] = static_cast<int64_t>(logits.scalar_type());
    return per_position.sum() / count;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &softmax = saved[0], &local_target = saved[1], &hit = saved[2], &valid = saved[3],
                     &count = saved[4];
    at::Tensor grad = softmax.clone();  // [P, V/N]
    grad.scatter_add_(1, local_target.unsqueeze(1), -hit.to(at::kFloat).unsqueeze(1));
    grad.mul_((valid.to(at::kFloat) * (grad_outputs[0] / count)).unsqueeze(1));
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
    return {grad.to(dtype), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

VocabShard vocab_shard(int64_t vocab_size, comm::Group& tp) {
  require(vocab_size % tp.size() == 0, "model.vocab_size = ", vocab_size, " is not a multiple of parallel.tp = ",
          tp.size(), " (each tensor-parallel rank holds vocab_size / tp rows of the token embedding)");
  const int64_t rows = vocab_size / tp.size();
  return {tp.rank() * rows, rows};
}

at::Tensor vocab_parallel_embedding(const at::Tensor& idx, const at::Tensor& weight, comm::Group& tp) {
  const int64_t start = tp.rank() * weight.size(0);
  at::Tensor outside = (idx < start) | (idx >= start + weight.size(0));  // [B, T]
  at::Tensor rows = at::embedding(weight, (idx - start).masked_fill(outside, 0));
  return reduce_from_tp(rows.masked_fill(outside.unsqueeze(-1), 0), tp);
}

at::Tensor vocab_parallel_cross_entropy(const at::Tensor& logits, const at::Tensor& targets, comm::Group& tp,
                                        int64_t ignore_index) {
  require(logits.dim() >= 1 && targets.numel() * logits.size(-1) == logits.numel(),
          "vocab-parallel cross-entropy: logits ", logits.sizes(), " do not match targets ", targets.sizes());
  return VocabParallelCrossEntropy::apply(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}), &tp,
                                          ignore_index);
}

}  // namespace tessera
