// Tensor-parallel communication functions: one autograd function parameterised by the operation
// it runs forward and the one it runs backward (tp_comm.h).
#include "parallel/tensor/tp_comm.h"

#include <optional>
#include <vector>

#include <torch/autograd.h>

#include "core/error.h"
#include "model/linear.h"
#include "precision/autocast.h"

namespace tessera {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

enum class Op : int64_t { identity, all_reduce, split, all_gather, reduce_scatter };

void require_divisible(const at::Tensor& x, int64_t dim, comm::Group& tp, const char* what) {
  require(x.size(dim) % tp.size() == 0, "tensor parallelism: ", what, " splits dimension ", dim, " of a ", x.sizes(),
          " tensor, whose size ", x.size(dim), " is not divisible by parallel.tp = ", tp.size());
}

// Chunk rank() along dim, as a contiguous copy.
at::Tensor split_along(const at::Tensor& x, int64_t dim, comm::Group& tp) {
  require_divisible(x, dim, tp, "a split");
  const int64_t n = x.size(dim) / tp.size();
  return x.narrow(dim, tp.rank() * n, n).clone(at::MemoryFormat::Contiguous);
}

// The members' tensors concatenated along dim in rank order: started by start(), returned by
// finish() once the all-gather is done (the caller may compute meanwhile).
struct GatherAlong {
  at::Tensor input, output;
  int64_t dim = 0;
  comm::Work work;

  static GatherAlong start(const at::Tensor& x, int64_t dim, comm::Group& tp) {
    GatherAlong g;
    g.dim = dim;
    g.input = x.movedim(dim, 0).contiguous();  // [n, rest...]
    std::vector<int64_t> shape = g.input.sizes().vec();
    shape[0] *= tp.size();
    g.output = at::empty(shape, g.input.options());  // [N n, rest...]: member i at [i n, (i+1) n)
    g.work = tp.all_gather_async(g.output.view(-1), g.input.view(-1));
    return g;
  }
  at::Tensor finish() {
    work.wait();
    return output.movedim(0, dim).contiguous();
  }
};

at::Tensor gather_along(const at::Tensor& x, int64_t dim, comm::Group& tp) {
  return GatherAlong::start(x, dim, tp).finish();
}

// Chunk rank() along dim of the members' sum.
at::Tensor reduce_scatter_along(const at::Tensor& x, int64_t dim, comm::Group& tp) {
  require_divisible(x, dim, tp, "a reduce-scatter");
  at::Tensor input = x.movedim(dim, 0).contiguous();  // [N n, rest...]: chunk j goes to member j
  std::vector<int64_t> shape = input.sizes().vec();
  shape[0] /= tp.size();
  at::Tensor output = at::empty(shape, input.options());
  tp.reduce_scatter(output.view(-1), input.view(-1));
  return output.movedim(0, dim).contiguous();
}

at::Tensor all_reduce(const at::Tensor& x, comm::Group& tp) {
  at::Tensor sum = x.clone(at::MemoryFormat::Contiguous);
  tp.all_reduce(sum);
  return sum;
}

at::Tensor run(Op op, const at::Tensor& x, int64_t dim, comm::Group& tp) {
  switch (op) {
    case Op::identity: return x;
    case Op::all_reduce: return all_reduce(x, tp);
    case Op::split: return split_along(x, dim, tp);
    case Op::all_gather: return gather_along(x, dim, tp);
    case Op::reduce_scatter: return reduce_scatter_along(x, dim, tp);
  }
  fail("internal: unknown tensor-parallel operation");
}

// forward_op(x) forward, backward_op(grad) backward, both along `dim` where they split or join.
struct TpFunction : public torch::autograd::Function<TpFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, comm::Group* tp, Op forward_op, Op backward_op,
                            int64_t dim) {
    ctx->saved_data["tp"] = reinterpret_cast<int64_t>(tp);
    ctx->saved_data["backward_op"] = static_cast<int64_t>(backward_op);
    ctx->saved_data["dim"] = dim;
    return run(forward_op, x, dim, *tp);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto* tp = reinterpret_cast<comm::Group*>(ctx->saved_data["tp"].toInt());
    const Op op = static_cast<Op>(ctx->saved_data["backward_op"].toInt());
    at::Tensor grad = run(op, grad_outputs[0], ctx->saved_data["dim"].toInt(), *tp);
    return {grad, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor apply(const at::Tensor& x, comm::Group& tp, Op forward_op, Op backward_op, int64_t dim) {
  if (tp.size() == 1) return x;
  require(dim >= 0 && dim < x.dim(), "tensor parallelism: a ", x.sizes(), " tensor has no dimension ", dim);
  return TpFunction::apply(x, &tp, forward_op, backward_op, dim);
}

constexpr int64_t kSequenceDim = 1;

// linear(gather(x)) keeping x (sequence_gathered_linear in tp_comm.h), for one weight or several
// joined along the output dimension (biases: one per weight, or none). The join, and a cast of it
// under autocast, live only while the forward's and the backward's products run: the function
// keeps the parameters themselves, so a pipeline rank holding several micro-batches holds no copy
// of them per micro-batch.
struct SequenceGatheredLinear : public torch::autograd::Function<SequenceGatheredLinear> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, at::TensorList weights, at::TensorList biases,
                            comm::Group* tp) {
    ctx->saved_data["tp"] = reinterpret_cast<int64_t>(tp);
    ctx->saved_data["rows"] = row_counts(weights);
    if (!biases.empty()) ctx->saved_data["bias_dtype"] = biases[0].scalar_type();  // their gradients' dtype
    std::vector<at::Tensor> saved{x};
    saved.insert(saved.end(), weights.begin(), weights.end());
    ctx->save_for_backward(saved);
    return at::linear(gather_along(x, kSequenceDim, *tp), join_rows(weights),
                      biases.empty() ? at::Tensor() : join_rows(biases));
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto* tp = reinterpret_cast<comm::Group*>(ctx->saved_data["tp"].toInt());
    const bool has_bias = ctx->saved_data.count("bias_dtype") > 0;
    const std::vector<int64_t> rows = ctx->saved_data["rows"].toIntVector();
    const size_t n = rows.size();
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const std::vector<at::Tensor> weights(saved.begin() + 1, saved.end());
    const at::Tensor grad = grads[0];
    const at::ScalarType dtype = grad.scalar_type();  // the forward's product's
    const int64_t out = grad.size(-1), in = weights[0].size(1);
    variable_list result(2 + n * (has_bias ? 2 : 1));  // x, the weights, the biases, tp
    bool weights_needed = false, biases_needed = false;
    for (size_t i = 0; i < n; ++i) {
      weights_needed = weights_needed || ctx->needs_input_grad(1 + i);
      biases_needed = biases_needed || (has_bias && ctx->needs_input_grad(1 + n + i));
    }
    // The kept input's all-gather runs while the input gradient's product does (Megatron's overlap).
    std::optional<GatherAlong> gathering;
    if (weights_needed) gathering = GatherAlong::start(x.to(dtype), kSequenceDim, *tp);
    if (ctx->needs_input_grad(0))
      result[0] = reduce_scatter_along(at::matmul(grad, join_rows(weights).to(dtype)), kSequenceDim, *tp)
                      .to(x.scalar_type());
    const at::Tensor grad2 = grad.reshape({-1, out});
    if (gathering) {
      const at::Tensor gathered = gathering->finish().reshape({-1, in});
      const at::Tensor dw = (dtype == at::kFloat ? at::mm(grad2.t(), gathered) : float_accumulated_mm(grad2.t(), gathered))
                                .to(weights[0].scalar_type());
      const std::vector<at::Tensor> parts = split_rows(dw, rows);
      for (size_t i = 0; i < n; ++i) result[1 + i] = parts[i];
    }
    if (biases_needed) {
      const at::Tensor db = grad2.sum(0, false, at::kFloat).to(ctx->saved_data["bias_dtype"].toScalarType());
      const std::vector<at::Tensor> parts = split_rows(db, rows);
      for (size_t i = 0; i < n; ++i) result[1 + n + i] = parts[i];
    }
    return result;
  }
};

}  // namespace

at::Tensor sequence_gathered_linear(const at::Tensor& x, at::TensorList weights, at::TensorList biases,
                                    comm::Group& tp) {
  if (tp.size() == 1) return linear_joined(x, weights, biases);
  require(x.dim() >= 2, "tensor parallelism: a sequence-gathered linear takes [B, T/N, ...], not ", x.sizes());
  require(biases.empty() || biases.size() == weights.size(), "tensor parallelism: a sequence-gathered linear of ",
          weights.size(), " weights takes as many biases or none, not ", biases.size());
  for (const at::Tensor& b : biases)
    require(b.defined(), "tensor parallelism: a sequence-gathered linear's biases are all defined or none given");
  return SequenceGatheredLinear::apply(x, weights, biases, &tp);
}

at::Tensor copy_to_tp(const at::Tensor& x, comm::Group& tp) { return apply(x, tp, Op::identity, Op::all_reduce, 0); }

at::Tensor reduce_from_tp(const at::Tensor& x, comm::Group& tp) {
  return apply(x, tp, Op::all_reduce, Op::identity, 0);
}

at::Tensor scatter_to_tp(const at::Tensor& x, comm::Group& tp) {
  return apply(x, tp, Op::split, Op::all_gather, x.dim() - 1);
}

at::Tensor gather_from_tp(const at::Tensor& x, comm::Group& tp) {
  return apply(x, tp, Op::all_gather, Op::split, x.dim() - 1);
}

at::Tensor scatter_to_sequence(const at::Tensor& x, comm::Group& tp) {
  return apply(x, tp, Op::split, Op::all_gather, kSequenceDim);
}

at::Tensor gather_from_sequence(const at::Tensor& x, comm::Group& tp) {
  return apply(x, tp, Op::all_gather, Op::reduce_scatter, kSequenceDim);
}

at::Tensor reduce_scatter_to_sequence(const at::Tensor& x, comm::Group& tp) {
  return apply(x, tp, Op::reduce_scatter, Op::all_gather, kSequenceDim);
}

}  // namespace tessera
