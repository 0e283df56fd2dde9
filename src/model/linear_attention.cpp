// Lightning attention (chunked), its recurrent reference, and the linear attention layer
// (linear_attention.h).
#include "model/linear_attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include <torch/types.h>

#include "core/error.h"
#include "memory/activation_checkpointing.h"
#include "memory/saved_activations.h"
#include "model/linear.h"
#include "model/norm.h"

namespace tessera {
namespace {

void check_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& decay) {
  require(q.dim() == 4 && k.sizes() == q.sizes() && v.dim() == 4 && v.size(0) == q.size(0) &&
              v.size(1) == q.size(1) && v.size(2) == q.size(2),
          "linear attention: q, k must be [B, H, T, d_k] and v [B, H, T, d_v] (got ", q.sizes(), ", ", k.sizes(),
          ", ", v.sizes(), ")");
  require(decay.dim() == 1 && decay.size(0) == q.size(1), "linear attention: decay must be [H] (got ",
          decay.sizes(), " for H = ", q.size(1), ")");
}

at::Tensor start_state(const at::Tensor& initial_state, const at::Tensor& q, const at::Tensor& v) {
  if (initial_state.defined()) return initial_state.to(at::kFloat);
  return torch::zeros({q.size(0), q.size(1), q.size(3), v.size(3)}, q.options().dtype(at::kFloat));
}

// exp(log_decay * distance) for log_decay [H] and distances [n...]: [H, n...].
at::Tensor decay_power(const at::Tensor& log_decay, const at::Tensor& distance) {
  auto shape = std::vector<int64_t>{log_decay.size(0)};
  for (int64_t i = 0; i < distance.dim(); ++i) shape.push_back(1);
  return at::exp(log_decay.view(shape) * distance.unsqueeze(0));
}

std::vector<double> power_of_two_slopes(int64_t n) {
  std::vector<double> s;
  for (int64_t h = 0; h < n; ++h) s.push_back(std::pow(2.0, -8.0 * static_cast<double>(h + 1) / static_cast<double>(n)));
  return s;
}

// n chunks of c tokens at once (q, k, v: [B, H, n * c, d] float32), entered with state [B, H, d_k, d_v]:
// the output [B, H, n * c, d_v] and the state after the last chunk. Every chunk's own terms are
// batched products over [B, H, n]; the state entering chunk m is a product with a decay matrix,
//   S_m = λ^{c m} S_in + Σ_{m' < m} λ^{c (m - 1 - m')} KV_{m'},   KV_m = Σ_j λ^{c - j} k_j^T v_j,
// for m = 0..n (S_n leaves), so no step depends on the one before it.
std::pair<at::Tensor, at::Tensor> chunks_at_once(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                 const at::Tensor& log_decay, int64_t c, int64_t n,
                                                 const at::Tensor& state) {
  const int64_t B = q.size(0), H = q.size(1), dk = q.size(3), dv = v.size(3);
  auto qc = q.reshape({B, H, n, c, dk}), kc = k.reshape({B, H, n, c, dk}), vc = v.reshape({B, H, n, c, dv});
  auto pos = torch::arange(c, q.options());                                        // i = 0..c-1
  auto dist = pos.unsqueeze(1) - pos.unsqueeze(0);                                 // [c, c] i - j
  auto D = decay_power(log_decay, dist.clamp_min(0)) * (dist >= 0).to(at::kFloat);  // [H, c, c]
  auto intra = at::matmul(at::matmul(qc, kc.transpose(-1, -2)) * D.unsqueeze(1), vc);  // [B, H, n, c, d_v]
  auto k_decay = decay_power(log_decay, c - pos).view({H, 1, c, 1});               // λ^{c-j}
  auto kv = at::matmul((kc * k_decay).transpose(-1, -2), vc);                      // [B, H, n, d_k, d_v]
  auto m = torch::arange(n + 1, q.options());
  auto gap = m.unsqueeze(1) - 1 - torch::arange(n, q.options()).unsqueeze(0);     // [n + 1, n] m - 1 - m'
  auto G = decay_power(log_decay, gap.clamp_min(0) * static_cast<double>(c)) * (gap >= 0).to(at::kFloat);
  auto entering = decay_power(log_decay, m * static_cast<double>(c)).view({1, H, n + 1, 1}) *
                      state.reshape({B, H, 1, dk * dv}) +
                  at::matmul(G.unsqueeze(0), kv.reshape({B, H, n, dk * dv}));       // [B, H, n + 1, d_k d_v]
  auto S = entering.narrow(2, 0, n).view({B, H, n, dk, dv});
  auto inter = at::matmul(qc * decay_power(log_decay, pos).view({H, 1, c, 1}), S);
  return {(intra + inter).reshape({B, H, n * c, dv}), entering.select(2, n).view({B, H, dk, dv})};
}

}  // namespace

at::Tensor lightning_attention_chunked(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                       const at::Tensor& decay, int64_t chunk, const at::Tensor& initial_state,
                                       at::Tensor* final_state) {
  check_inputs(q, k, v, decay);
  require(chunk > 0, "linear attention: chunk must be positive (got ", chunk, ")");
  const int64_t T = q.size(2), whole = T / chunk * chunk;
  auto qf = q.to(at::kFloat), kf = k.to(at::kFloat), vf = v.to(at::kFloat);
  auto log_decay = at::log(decay.to(q.device(), at::kFloat));  // [H], < 0
  auto state = start_state(initial_state, q, v);                // [B, H, d_k, d_v]
  std::vector<at::Tensor> outputs;
  auto run = [&](int64_t start, int64_t c, int64_t n) {  // n chunks of c tokens from start
    auto [out, next] = chunks_at_once(qf.narrow(2, start, n * c), kf.narrow(2, start, n * c),
                                      vf.narrow(2, start, n * c), log_decay, c, n, state);
    outputs.push_back(out);
    state = next;
  };
  // The whole chunks, kChunksAtOnce at a time (the decay matrix and the per-chunk states grow with
  // the square and the count of the chunks in one call), then the shorter last one.
  constexpr int64_t kChunksAtOnce = 256;
  for (int64_t start = 0; start < whole; start += kChunksAtOnce * chunk)
    run(start, chunk, std::min(kChunksAtOnce, (whole - start) / chunk));
  if (T > whole) run(whole, T - whole, 1);
  if (final_state) *final_state = state;
  return at::cat(outputs, 2).to(q.scalar_type());
}

at::Tensor linear_attention_recurrent(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      const at::Tensor& decay, const at::Tensor& initial_state,
                                      at::Tensor* final_state) {
  check_inputs(q, k, v, decay);
  auto qf = q.to(at::kFloat), kf = k.to(at::kFloat), vf = v.to(at::kFloat);
  auto lambda = decay.to(q.device(), at::kFloat).view({1, -1, 1, 1});
  auto state = start_state(initial_state, q, v);
  std::vector<at::Tensor> outputs;
  for (int64_t i = 0; i < q.size(2); ++i) {
    auto ki = kf.select(2, i), vi = vf.select(2, i), qi = qf.select(2, i);  // [B, H, d]
    state = state + ki.unsqueeze(-1) * vi.unsqueeze(-2);
    outputs.push_back(at::matmul(qi.unsqueeze(-2), state).squeeze(-2));
    state = lambda * state;
  }
  if (final_state) *final_state = state;
  return at::stack(outputs, 2).to(q.scalar_type());
}

at::Tensor alibi_slopes(int64_t n_head) {
  int64_t n = 1;
  while (n * 2 <= n_head) n *= 2;
  auto slopes = power_of_two_slopes(n);
  if (n < n_head) {
    auto extra = power_of_two_slopes(2 * n);
    for (int64_t i = 0; static_cast<int64_t>(slopes.size()) < n_head; i += 2) slopes.push_back(extra[i]);
  }
  return torch::tensor(slopes, torch::kDouble).to(at::kFloat);
}

ParameterSpecs LinearAttentionImpl::parameter_specs() const {
  ParameterSpecs specs = row_linear("o_proj", residual_std_);
  for (const char* column : {"q_proj", "k_proj", "v_proj", "u_proj"}) add_specs(specs, column_linear(column, 0.02));
  return specs;
}

LinearAttentionImpl::LinearAttentionImpl(const ModelOptions& opts, const at::TensorOptions& where)
    : head_dim_(opts.head_width()),
      chunk_(opts.linear_chunk),
      residual_std_(residual_std(opts.n_layer)),
      decay_(at::exp(-alibi_slopes(opts.n_head))) {
  const int64_t C = opts.n_embd;
  auto linear = [&](const char* name) { return register_module(name, Linear(C, C, opts.bias, where)); };
  q_proj = linear("q_proj");
  k_proj = linear("k_proj");
  v_proj = linear("v_proj");
  u_proj = linear("u_proj");
  o_proj = linear("o_proj");
}

void LinearAttentionImpl::select_heads(int64_t first, int64_t count) {
  require(first >= 0 && count >= 1 && first + count <= decay_.size(0), "linear attention: heads [", first, ", ",
          first + count, ") are not within the layer's ", decay_.size(0), " heads");
  decay_ = decay_.narrow(0, first, count).clone();
  decay_device_ = at::Tensor();
}

at::Tensor LinearAttentionImpl::core(const at::Tensor& qkv) {
  const AttentionCoreSaving saving;  // memory.attention_compression (memory/saved_activations.h)
  const int64_t B = qkv.size(1), T = qkv.size(3), C = qkv.size(2) * qkv.size(4);
  if (!decay_device_.defined() || decay_device_.device() != qkv.device()) decay_device_ = decay_.to(qkv.device());
  auto o = kernel_ ? kernel_(qkv[0], qkv[1], qkv[2], decay_device_, chunk_)
                   : lightning_attention_chunked(qkv[0], qkv[1], qkv[2], decay_device_, chunk_);
  return rms_normalize(o).transpose(1, 2).contiguous().view({B, T, C});
}

at::Tensor LinearAttentionImpl::forward(const at::Tensor& x) {
  const at::Tensor in = region_.input(x);  // [B, T, C] (the whole sequence under sequence-parallel regions)
  const int64_t B = in.size(0), T = in.size(1);
  auto heads = [&](const at::Tensor& t) { return t.view({B, T, t.size(2) / head_dim_, head_dim_}).transpose(1, 2); };
  auto qkv = at::stack(
      {heads(at::silu(linear(q_proj, in))), heads(at::silu(linear(k_proj, in))), heads(linear(v_proj, in))});
  auto o = checkpoint_core_ && checkpoint_applies(qkv)
               ? checkpoint([this](const at::Tensor& t) { return core(t); }, qkv)
               : core(qkv);
  return region_.output(o_proj, o * at::sigmoid(linear(u_proj, in)));
}

}  // namespace tessera
