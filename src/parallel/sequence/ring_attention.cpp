// Causal ring attention: blockwise online softmax forward, ring backward (ring_attention.h).
#include "parallel/sequence/ring_attention.h"

#include <cmath>
#include <future>
#include <limits>

#include <torch/autograd.h>
#include <torch/autograd.h>

namespace tessera {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr int64_t kKeyValueTag = 11, kGradientTag = 12;

// One send_recv with the ring neighbours (send to t+1, receive from t-1; either may be undefined)
// on its own thread, so that the caller computes meanwhile. Both tensors must outlive wait().
class Exchange {
 public:
  Exchange() = default;
  Exchange(comm::Group& sp, at::Tensor send, at::Tensor recv, int64_t tag) {
    if (!send.defined() && !recv.defined()) return;
    const int64_t W = sp.size(), next = (sp.rank() + 1) % W, prev = (sp.rank() + W - 1) % W;
    done_ = std::async(std::launch::async, [&sp, send, recv, next, prev, tag] {
      if (send.defined() && recv.defined()) sp.send_recv(send, next, recv, prev, tag);
      else if (send.defined()) sp.send(send, next, tag);
      else sp.recv(recv, prev, tag);
    });
  }
  void wait() {
    if (done_.valid()) done_.get();
  }

 private:
  std::future<void> done_;
};

// q k^T / sqrt(d) for one query block and one key block, float32 [B, H, C, C]; the diagonal block
// (a rank's own keys) is masked above the diagonal with -inf.
at::Tensor block_scores(const at::Tensor& q, const at::Tensor& k, bool diagonal) {
  at::Tensor scores = at::matmul(q, k.transpose(-1, -2)) * (1.0 / std::sqrt(static_cast<double>(q.size(-1))));
  if (!diagonal) return scores;
  const int64_t C = q.size(2);
  const at::Tensor above = at::ones({C, C}, q.options().dtype(at::kBool)).triu(1);
  return scores.masked_fill(above, -std::numeric_limits<double>::infinity());
}

// The running softmax of one query block over the key blocks seen so far (float32).
struct OnlineSoftmax {
  at::Tensor max;  // [B, H, C, 1] m: the largest score of each row so far
  at::Tensor sum;  // [B, H, C, 1] l: Σ exp(score - m)
  at::Tensor acc;  // [B, H, C, d]   Σ exp(score - m) v

  // The first block must be the diagonal one: every row then has a finite score.
  void add(const at::Tensor& scores, const at::Tensor& v) {
    const at::Tensor block_max = scores.amax(-1, /*keepdim=*/true);
    if (!max.defined()) {
      max = block_max;
      const at::Tensor p = at::exp(scores - max);
      sum = p.sum(-1, /*keepdim=*/true);
      acc = at::matmul(p, v);
      return;
    }
    const at::Tensor new_max = at::maximum(max, block_max);
    const at::Tensor rescale = at::exp(max - new_max), p = at::exp(scores - new_max);
    sum = sum * rescale + p.sum(-1, /*keepdim=*/true);
    acc = acc * rescale + at::matmul(p, v);
    max = new_max;
  }
};

struct RingAttentionFunction : public torch::autograd::Function<RingAttentionFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            comm::Group* sp) {
    const int64_t t = sp->rank(), W = sp->size();
    const at::Tensor qf = q.to(at::kFloat);
    at::Tensor held = at::stack({k, v});  // [2, B, H, C, d]: the key/value block of rank t - i at step i
    OnlineSoftmax softmax;
    for (int64_t i = 0; i <= t; ++i) {
      at::Tensor incoming = i < t ? at::empty_like(held) : at::Tensor();
      Exchange exchange(*sp, t + 1 < W ? held : at::Tensor(), incoming, kKeyValueTag);
      softmax.add(block_scores(qf, held[0].to(at::kFloat), i == 0), held[1].to(at::kFloat));
      exchange.wait();
      held = incoming;
    }
    const at::Tensor out = (softmax.acc / softmax.sum).to(q.scalar_type());
    const at::Tensor lse = softmax.max + at::log(softmax.sum);  // [B, H, C, 1]
    ctx->save_for_backward({q, k, v, out, lse});
    ctx->saved_data["sp"] = reinterpret_cast<int64_t>(sp);
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto* sp = reinterpret_cast<comm::Group*>(ctx->saved_data["sp"].toInt());
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3], &lse = saved[4];
    const int64_t t = sp->rank(), W = sp->size();
    const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
    const at::Tensor qf = q.to(at::kFloat), d_out = grad_outputs[0].to(at::kFloat);
    const at::Tensor delta = (d_out * out.to(at::kFloat)).sum(-1, /*keepdim=*/true);  // D [B, H, C, 1]
    at::Tensor d_q = at::zeros_like(qf);
    at::Tensor held = at::stack({k, v});
    // The (dK, dV) accumulator of the block held, float32 [2, B, H, C, d], and its exchange.
    at::Tensor d_held = at::zeros(held.sizes(), held.options().dtype(at::kFloat));
    at::Tensor d_incoming;
    Exchange gradient_exchange;
    for (int64_t i = 0; i < W; ++i) {
      at::Tensor incoming = i < t ? at::empty_like(held) : at::Tensor();
      Exchange exchange(*sp, i <= t && t + 1 < W ? held : at::Tensor(), incoming, kKeyValueTag);
      at::Tensor part;
      if (i <= t) {
        const at::Tensor kf = held[0].to(at::kFloat), vf = held[1].to(at::kFloat);
        const at::Tensor p = at::exp(block_scores(qf, kf, i == 0) - lse);  // [B, H, C, C]
        const at::Tensor d_scores = p * (at::matmul(d_out, vf.transpose(-1, -2)) - delta);
        d_q += at::matmul(d_scores, kf) * scale;
        part = at::stack({at::matmul(d_scores.transpose(-1, -2), qf) * scale, at::matmul(p.transpose(-1, -2), d_out)});
      }
      gradient_exchange.wait();
      if (i > 0) d_held = d_incoming;
      if (part.defined()) d_held = d_held + part;
      d_incoming = at::empty_like(d_held);
      gradient_exchange = Exchange(*sp, d_held, d_incoming, kGradientTag);
      exchange.wait();
      if (incoming.defined()) held = incoming;
    }
    gradient_exchange.wait();  // after W passes the accumulator of this rank's own block is back
    return {d_q.to(q.scalar_type()), d_incoming[0].to(k.scalar_type()), d_incoming[1].to(v.scalar_type()),
            at::Tensor()};
  }
};

}  // namespace

at::Tensor ring_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, comm::Group& sp) {
  if (sp.size() == 1) return at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true);
  return RingAttentionFunction::apply(q, k, v, &sp);
}

}  // namespace tessera
