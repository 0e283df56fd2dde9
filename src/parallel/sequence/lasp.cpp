// LASP's autograd function: the ring and the all-gather variant (lasp.h).
#include "parallel/sequence/lasp.h"

#include <torch/autograd.h>
#include <torch/autograd.h>
#include <torch/types.h>
#include <torch/csrc/autograd/graph_task.h>

#include "core/error.h"
#include "model/linear_attention.h"

namespace tessera {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr int64_t kForwardTag = 1, kBackwardTag = 2;

// λ^C per head as [1, H, 1, 1] float32: the decay of a state carried across one chunk of C tokens.
at::Tensor chunk_decay(const at::Tensor& decay, int64_t chunk_length) {
  return at::exp(at::log(decay.to(at::kFloat)) * static_cast<double>(chunk_length)).view({1, -1, 1, 1});
}

// The chunk's own state from zero: M = Σ_j λ^{C-j} k_j^T v_j, [B, H, d_k, d_v] float32.
at::Tensor own_state(const at::Tensor& k, const at::Tensor& v, const at::Tensor& decay) {
  const int64_t C = k.size(2);
  auto distance = static_cast<double>(C) - torch::arange(C, k.options().dtype(at::kFloat));  // C - j
  auto weights = at::exp(at::log(decay.to(at::kFloat)).view({-1, 1}) * distance.unsqueeze(0));  // [H, C]
  return at::matmul((k.to(at::kFloat) * weights.unsqueeze(-1)).transpose(-1, -2), v.to(at::kFloat));
}

// Σ over the all-gathered states `gathered` [W, B, H, d_k, d_v] of those strictly before rank t
// (from_front) or strictly after it, each decayed by λ^C per chunk between it and rank t.
at::Tensor decayed_sum(const at::Tensor& gathered, int64_t t, bool from_front, const at::Tensor& step_decay) {
  const int64_t W = gathered.size(0);
  at::Tensor sum = at::zeros_like(gathered[0]);
  if (from_front)
    for (int64_t s = 0; s < t; ++s) sum = step_decay * sum + gathered[s];
  else
    for (int64_t s = W - 1; s > t; --s) sum = step_decay * sum + gathered[s];
  return sum;
}

at::Tensor all_gather_states(comm::Group& sp, const at::Tensor& state) {
  at::Tensor local = state.contiguous();
  std::vector<int64_t> shape{sp.size()};
  for (int64_t d : local.sizes()) shape.push_back(d);
  at::Tensor gathered = at::empty(shape, local.options());
  sp.all_gather(gathered.view({-1}), local.view({-1}));
  return gathered;
}

struct LaspFunction : public torch::autograd::Function<LaspFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& decay, int64_t chunk, comm::Group* sp, int64_t variant) {
    const int64_t t = sp->rank(), W = sp->size();
    at::Tensor s_in = at::zeros({q.size(0), q.size(1), q.size(3), v.size(3)}, q.options().dtype(at::kFloat));
    if (static_cast<LaspVariant>(variant) == LaspVariant::ring) {
      if (t > 0) sp->recv(s_in, t - 1, kForwardTag);
    } else {
      s_in = decayed_sum(all_gather_states(*sp, own_state(k, v, decay)), t, true,
                         chunk_decay(decay, q.size(2)));
    }
    // The local chunk's graph on detached inputs, kept for backward (KV-state caching).
    at::AutoGradMode grad_mode(true);
    at::Tensor qd = q.detach().requires_grad_(), kd = k.detach().requires_grad_(), vd = v.detach().requires_grad_();
    at::Tensor s_in_leaf = s_in.detach().requires_grad_();
    at::Tensor s_out;
    at::Tensor o = lightning_attention_chunked(qd, kd, vd, decay, chunk, s_in_leaf, &s_out);
    if (static_cast<LaspVariant>(variant) == LaspVariant::ring && t + 1 < W)
      sp->send(s_out.detach().contiguous(), t + 1, kForwardTag);
    ctx->saved_data["o"] = o;
    ctx->saved_data["s_out"] = s_out;
    ctx->saved_data["q"] = qd;
    ctx->saved_data["k"] = kd;
    ctx->saved_data["v"] = vd;
    ctx->saved_data["s_in"] = s_in_leaf;
    ctx->saved_data["decay"] = decay;
    ctx->saved_data["variant"] = variant;
    ctx->saved_data["sp"] = reinterpret_cast<int64_t>(sp);
    return o.detach();
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    // A backward that keeps its graph (a pipeline's input-gradient pass, before the weight-gradient
    // pass runs this node again) keeps the local chunk's graph too; otherwise it is freed here.
    const bool keep = torch::autograd::get_current_graph_task_keep_graph();
    auto saved = [&](const char* key) { return ctx->saved_data[key].toTensor(); };
    auto* sp = reinterpret_cast<comm::Group*>(ctx->saved_data["sp"].toInt());
    const auto variant = static_cast<LaspVariant>(ctx->saved_data["variant"].toInt());
    const int64_t t = sp->rank(), W = sp->size();
    at::Tensor o = saved("o"), s_out = saved("s_out"), s_in = saved("s_in");
    at::Tensor q = saved("q"), k = saved("k"), v = saved("v");
    at::Tensor d_o = grad_outputs[0].defined() ? grad_outputs[0] : at::zeros_like(o);
    at::AutoGradMode grad_mode(true);
    variable_list grads;
    if (variant == LaspVariant::ring) {
      at::Tensor d_s_out = at::zeros_like(s_out);
      if (t + 1 < W) sp->recv(d_s_out, t + 1, kBackwardTag);
      grads = torch::autograd::grad({o, s_out}, {q, k, v, s_in}, {d_o, d_s_out}, keep);
      if (t > 0) sp->send(grads[3].contiguous(), t - 1, kBackwardTag);
    } else {
      const at::Tensor d_s_in = torch::autograd::grad({o}, {s_in}, {d_o}, /*retain_graph=*/true)[0];
      const at::Tensor d_s_out =
          decayed_sum(all_gather_states(*sp, d_s_in), t, false, chunk_decay(saved("decay"), q.size(2)));
      grads = torch::autograd::grad({o, s_out}, {q, k, v}, {d_o, d_s_out}, keep);
    }
    if (!keep) ctx->saved_data.clear();
    return {grads[0], grads[1], grads[2], at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

LaspVariant lasp_variant(const std::string& sp_method) {
  if (sp_method == "lasp") return LaspVariant::ring;
  if (sp_method == "lasp2") return LaspVariant::allgather;
  fail("parallel.sp_method = \"", sp_method, "\" is not a LASP variant (lasp or lasp2)");
}

at::Tensor lasp_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& decay,
                          int64_t chunk, comm::Group& sp, LaspVariant variant) {
  if (sp.size() == 1) return lightning_attention_chunked(q, k, v, decay, chunk);
  return LaspFunction::apply(q, k, v, decay, chunk, &sp, static_cast<int64_t>(variant));
}

void apply_lasp(TransformerLM& model, comm::Group& sp, LaspVariant variant) {
  for (int64_t l : model->layers())
    model->block(l)->linear_attn->set_kernel(
        [&sp, variant](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& decay,
                       int64_t chunk) { return lasp_attention(q, k, v, decay, chunk, sp, variant); });
}

}  // namespace tessera
