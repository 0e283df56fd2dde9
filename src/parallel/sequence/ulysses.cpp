// DeepSpeed-Ulysses: the two all-to-all layouts and their autograd function (ulysses.h).
#include "parallel/sequence/ulysses.h"

#include <torch/autograd.h>
#include <torch/autograd.h>

#include "core/error.h"

namespace tessera {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// x: [P, B, H, C, d], this rank's sequence chunk of all heads -> [P, B, H/W, W C, d], head group
// rank() of the whole sequence. Send chunk j is head group j; receive chunk s is sequence chunk s.
at::Tensor sequence_to_heads(const at::Tensor& x, comm::Group& sp) {
  const int64_t W = sp.size(), P = x.size(0), B = x.size(1), H = x.size(2), C = x.size(3), d = x.size(4);
  at::Tensor send = x.reshape({P, B, W, H / W, C, d}).permute({2, 0, 1, 3, 4, 5}).contiguous();
  at::Tensor received = at::empty_like(send);  // [W, P, B, H/W, C, d]
  sp.all_to_all(received, send);
  return received.permute({1, 2, 3, 0, 4, 5}).reshape({P, B, H / W, W * C, d});
}

// The inverse: y: [P, B, H/W, W C, d] -> [P, B, H, C, d]. Send chunk j is sequence chunk j;
// receive chunk s is head group s.
at::Tensor heads_to_sequence(const at::Tensor& y, comm::Group& sp) {
  const int64_t W = sp.size(), P = y.size(0), B = y.size(1), Hw = y.size(2), C = y.size(3) / W, d = y.size(4);
  at::Tensor send = y.reshape({P, B, Hw, W, C, d}).permute({3, 0, 1, 2, 4, 5}).contiguous();
  at::Tensor received = at::empty_like(send);  // [W, P, B, H/W, C, d]
  sp.all_to_all(received, send);
  return received.permute({1, 2, 0, 3, 4, 5}).reshape({P, B, W * Hw, C, d});
}

// One layout change; its backward is the inverse layout change of the gradient.
struct AllToAllFunction : public torch::autograd::Function<AllToAllFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, comm::Group* sp, bool to_heads) {
    ctx->saved_data["sp"] = reinterpret_cast<int64_t>(sp);
    ctx->saved_data["to_heads"] = to_heads;
    return to_heads ? sequence_to_heads(x, *sp) : heads_to_sequence(x, *sp);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto* sp = reinterpret_cast<comm::Group*>(ctx->saved_data["sp"].toInt());
    const at::Tensor& grad = grad_outputs[0];
    at::Tensor grad_in = ctx->saved_data["to_heads"].toBool() ? heads_to_sequence(grad, *sp) : sequence_to_heads(grad, *sp);
    return {grad_in, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor ulysses_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, comm::Group& sp) {
  const int64_t H = q.size(1), W = sp.size();
  require(H % W == 0, "internal: Ulysses over parallel.sp = ", W, " ranks got ", H,
          " heads (check_sequence_parallel refuses model.n_head not a multiple of sp * tp)");
  if (W == 1) return at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true);
  at::Tensor heads = AllToAllFunction::apply(at::stack({q, k, v}), &sp, true);  // [3, B, H/W, T, d]
  at::Tensor y = at::scaled_dot_product_attention(heads[0], heads[1], heads[2], {}, 0.0, /*is_causal=*/true);
  return AllToAllFunction::apply(y.unsqueeze(0), &sp, false)[0];
}

}  // namespace tessera
