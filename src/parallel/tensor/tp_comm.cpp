// Tensor-parallel communication functions: one autograd function parameterised by the operation
// it runs forward and the one it runs backward (tp_comm.h).
#include "parallel/tensor/tp_comm.h"

#include <optional>
#include <vector>

#include <torch/autograd.h>
#include <torch/autograd.h>

#include "core/error.h"
#include "model/linear.h"

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

// linear(gather(x)) keeping x (sequence_gathered_linear in tp_comm.h). A custom function takes no
// undefined input, so a layer without a bias calls the two-input forward.
struct SequenceGatheredLinear : public torch::autograd::Function<SequenceGatheredLinear> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight, comm::Group* tp) {
    return run(ctx, x, weight, at::Tensor(), tp);
  }
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& bias, comm::Group* tp) {
    return run(ctx, x, weight, bias, tp);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto* tp = reinterpret_cast<comm::Group*>(ctx->saved_data["tp"].toInt());
    const bool has_bias = ctx->saved_data.count("bias_dtype") > 0;
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &weight = saved[1];
    const at::Tensor grad = grads[0];
    const at::ScalarType dtype = grad.scalar_type();  // the forward's product's
    const int64_t out = weight.size(0), in = weight.size(1);
    variable_list result(has_bias ? 4 : 3);
    // The kept input's all-gather runs while the input gradient's product does (Megatron's overlap).
    std::optional<GatherAlong> gathering;
    if (ctx->needs_input_grad(1)) gathering = GatherAlong::start(x.to(dtype), kSequenceDim, *tp);
    if (ctx->needs_input_grad(0))
      result[0] = reduce_scatter_along(at::matmul(grad, weight.to(dtype)), kSequenceDim, *tp).to(x.scalar_type());
    const at::Tensor grad2 = grad.reshape({-1, out});
    if (gathering) {
      const at::Tensor gathered = gathering->finish().reshape({-1, in});
      result[1] = (dtype == at::kFloat ? at::mm(grad2.t(), gathered) : float_accumulated_mm(grad2.t(), gathered))
                      .to(weight.scalar_type());
    }
    if (has_bias && ctx->needs_input_grad(2))
      result[2] = grad2.sum(0, false, at::kFloat).to(ctx->saved_data["bias_dtype"].toScalarType());
    return result;
  }

 private:
  static at::Tensor run(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                        comm::Group* tp) {
    ctx->saved_data["tp"] = reinterpret_cast<int64_t>(tp);
    if (bias.defined()) ctx->saved_data["bias_dtype"] = bias.scalar_type();  // its gradient's dtype
    ctx->save_for_backward({x, weight});
    return at::linear(gather_along(x, kSequenceDim, *tp), weight, bias);
  }
};

}  // namespace

at::Tensor sequence_gathered_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                                    comm::Group& tp) {
  if (tp.size() == 1) return at::linear(x, weight, bias);
  require(x.dim() >= 2, "tensor parallelism: a sequence-gathered linear takes [B, T/N, ...], not ", x.sizes());
  return bias.defined() ? SequenceGatheredLinear::apply(x, weight, bias, &tp)
                        : SequenceGatheredLinear::apply(x, weight, &tp);
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
