// Mixture-of-experts feed-forward (model.ffn = moe; papers.md §5): top-k of E experts (Switch
// top-1, GShard top-2, Mixtral, DeepSeek, any k <= E), capacity or dropless routing, shared experts.
//
// For N = B*T tokens x [N, C] and E experts of hidden width H (model.expert_hidden()):
//   logits = x W_r^T in float32 (router Linear "router", no bias, autocast off)     [N, E]
//   scores s = softmax(logits) (model.moe_score = softmax) or sigmoid(logits) (DeepSeek-V3)
//   (g, e) = top-k(s)                                                                [N, k]
//   gates: renormalized (model.renormalized_gates(): Mixtral, DeepSeek-V3, GShard) g_i / Σ_j g_j,
//          else g_i (Switch, DeepSeekMoE); times model.moe_routed_scale (DeepSeek-V3's 2.5)
//   slots by priority: every token's first choice, in token order, then every second choice, ...
//   capacity routing: each expert has cap = ceil(k * N / E * capacity_factor) rows; a choice whose
//     slot is >= cap is dropped (gate 0; the block's residual carries the token);
//   dropless routing (capacity_factor = 0): expert e has exactly count_e rows (the counts read on
//     the host: the one sync of a dropless layer), nothing dropped, nothing padded;
//   the buffer: the experts' rows one after the other, sizes[e] rows for expert e      [R, C]
//   dispatch: buffer[offset_e + slot] = x[token]
//   experts:  rows of e -> act(rows @ w_fc[e] + b_fc[e]) @ w_proj[e] + b_proj[e]       [R, C]
//             act: gelu_tanh (w_fc [E, C, H]) or SwiGLU (model.swiglu_experts(): mlp = swiglu set;
//             w_fc [E, C, 2H], its columns a then g, as the MLP's rows: act = a * silu(g))
//             (equal sizes: one batched matmul over [E, cap, C]; else at::_grouped_mm; every path
//             returns autocast's dtype, so ep ranks whose experts took different paths agree)
//   combine:  y[token] += gate * out[offset_e + slot]                                 [N, C]
//   shared experts (model.moe_shared_experts = S > 0; DeepSeek): y += shared(x), one MLP of
//             width S * H that every token runs (module "shared"; replicated under tp and ep);
//             with model.moe_shared_gate (Qwen2-MoE) y += sigmoid(x . g) shared(x), g the
//             replicated [1, C] weight of module "shared_gate".
// Expert weights are stacked ([E, ...]) so that expert parallelism can shard them along E, and
// dispatch/experts/combine are separate steps so that communication can go between them. The
// routed step (tokens and their routing -> Σ_k gate * expert output, [N, C]) is replaceable from
// outside (set_routed_step): expert parallelism (parallel/expert/) installs one that carries the
// tokens to the ranks holding their experts (w_fc etc. then hold only those, [E/ep, ...]), runs
// them through the function it is given and brings the weighted outputs back; an empty step runs
// combine(experts(dispatch(x))) here. The model never communicates.
//
// Auxiliary losses (float32 scalars, summed into MoEOutput::aux_loss):
//   load balance (Switch): aux_coef * E * Σ_e f_e P_e, f_e = fraction of tokens whose top-1 choice
//     is e (before dropping, no gradient), P_e = mean over tokens of s_e / Σ_e' s_e' (the softmax
//     probability itself);
//   router z-loss: z_coef * mean_n(logsumexp(logits_n)^2).
// The balance loss's f counts this forward's tokens (model.moe_aux_scope = micro_batch), or, when a
// balance count sum is installed (set_balance_count_sum; parallel/parallelize.h does so for
// moe_aux_scope = global), the tokens of every rank routing the same micro-batch: the top-1
// counts and the token count are summed over them before f is formed, while P_e stays this rank's
// mean. Averaged over those ranks as their gradients are, the loss is then the one one process
// would compute on all their tokens at once (Qwen's global-batch balance, per micro-batch).
// Aux-loss-free balancing (model.moe_bias_update_rate > 0; DeepSeek-V3): the top-k choice is made
// on s + b, b a per-expert bias that takes no gradient, while the gates stay the scores s of the
// chosen experts; after each step b_e += rate * sign(mean load - load_e), the loads counted over
// every rank that routes (parallel/parallelize.h), so b is the same everywhere. b is state: a
// checkpoint keeps it ("moe.h.<layer>.selection_bias").
// Group-limited routing (model.moe_groups > 1; DeepSeek-V3's n_group and topk_group): the experts
// form moe_groups equal groups, each scored per token by the sum of its two best selection scores
// (s + b); the experts outside the token's moe_topk_groups best groups are out of its reach, and
// its top k are chosen among the rest, as transformers' DeepseekV3TopkRouter does
// (HfDeepseekV3.GroupLimitedRoutingChoosesAsTransformers). Only the choice changes here; when
// the groups are the nodes of the expert-parallel ranks, hierarchical dispatch
// (parallel.ep_dispatch) sends each token over at most moe_topk_groups nodes' links.
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "model/linear.h"
#include "model/mlp.h"
#include "model/model_options.h"
#include "model/parameter_spec.h"

namespace tessera {

// Where each token's choices go.
struct MoERouting {
  at::Tensor expert;    // [N, k] int64
  at::Tensor slot;      // [N, k] int64, position among the expert's rows; == capacity when dropped
  at::Tensor row;       // [N, k] int64, row in the buffer (offset_e + slot); == rows() when dropped
  at::Tensor gate;      // [N, k] float32, zero for dropped choices (differentiable to the router)
  at::Tensor assigned;  // [E] int64, choices routed to each expert before dropping
  at::Tensor aux_loss;  // float32 scalar: load-balance + z-loss, coefficients applied
  int64_t capacity = 0;        // capacity routing: rows per expert; dropless: the busiest expert's count
  std::vector<int64_t> sizes;  // [E] rows of each expert in the buffer (on the host)
  int64_t rows() const;        // Σ sizes
};

// Routing statistics summed over the forwards since reset_statistics() (a step's micro-batches),
// a recomputation under activation checkpointing not counted again (memory/activation_checkpointing.h).
// Tensors, detached, so reading them is the caller's sync.
struct MoEStatistics {
  int64_t forwards = 0, tokens = 0, top_k = 0;
  at::Tensor assigned;      // [E] int64: choices routed to each expert before dropping
  at::Tensor kept;          // [E] int64: choices processed (<= capacity per forward)
  at::Tensor balance_loss;  // float32 scalar: the load-balance terms summed (coefficient applied)
  at::Tensor z_loss;        // float32 scalar: the z-loss terms summed (coefficient applied)
  double dropped_fraction() const;  // dropped choices / (tokens * top_k)
};

// One MoE layer's statistics over a step, summed over every rank that routed (the trainer's
// metrics; parallel/parallelize.h gathers them).
struct MoELayerStatistics {
  int64_t layer = 0;
  std::vector<double> load;  // per expert: choices routed to it before dropping
  std::vector<double> kept;  // per expert: choices processed
  double tokens = 0, forwards = 0;
  double balance_loss = 0, z_loss = 0;  // mean over the forwards (coefficients applied)
  int64_t top_k = 0;
  // MaxVio (DeepSeek-V3's load imbalance): max_e load_e / mean load - 1 (0 when balanced).
  double max_violation() const;
  double dropped_fraction() const;  // 1 - kept / (tokens * top_k)
};

struct MoEOutput {
  at::Tensor y;         // [B, T, C]
  at::Tensor aux_loss;  // float32 scalar
};

class MoEImpl : public torch::nn::Module {
 public:
  MoEImpl(const ModelOptions& opts, const at::TensorOptions& where);
  MoEOutput forward(const at::Tensor& x);  // x [B, T, C]

  MoERouting route(const at::Tensor& x);                                   // x [N, C]
  at::Tensor dispatch(const at::Tensor& x, const MoERouting& r) const;  // -> buffer [R, C]
  // The experts this process holds (w_fc.size(0) of them) on `rows` [Σ sizes, C], sizes[e] rows of
  // each in order -> [Σ sizes, C].
  at::Tensor experts(const at::Tensor& rows, const std::vector<int64_t>& sizes) const;
  at::Tensor combine(const at::Tensor& out, const MoERouting& r) const;  // out [R, C] -> [N, C]

  // The experts this process holds, as experts() above.
  using ExpertFn = std::function<at::Tensor(const at::Tensor& rows, const std::vector<int64_t>& sizes)>;
  // Tokens x [N, C] routed by r -> the routed experts' sum Σ_k r.gate * expert(x), [N, C] (in the
  // experts' output dtype); `experts` computes the experts this process holds.
  using RoutedStep = std::function<at::Tensor(const at::Tensor& x, const MoERouting& r, const ExpertFn& experts)>;
  // Installs the step (once: a second owner is refused; an empty step restores the default).
  void set_routed_step(RoutedStep step);
  // Sums `counts` [E + 1] float32 (the top-1 count of each expert, then the tokens) in place over
  // the ranks routing the same micro-batch (a collective: every such rank routes its MoE layers in
  // the same order, recomputation included). Installed once, as the routed step.
  using CountSum = std::function<void(at::Tensor& counts)>;
  void set_balance_count_sum(CountSum sum);

  // The aux-loss-free selection bias [E] float32 on the CPU; undefined (zero) before the first update.
  const at::Tensor& selection_bias() const { return selection_bias_; }
  void set_selection_bias(at::Tensor bias);
  // b_e += rate * sign(mean(load) - load_e).
  void update_selection_bias(const std::vector<double>& load, double rate);

  const MoEStatistics& statistics() const { return stats_; }
  void reset_statistics() { stats_ = MoEStatistics(); }
  // The adaptive codecs' probe (parallel/activation_probe.h) runs forwards that are not the step's:
  // it puts the statistics back as it found them (no forward of it counts into the loads, the
  // metrics or the selection bias's update), and routes on this rank's counts alone, the count
  // sum taken out meanwhile (its collective would wait for ranks that do not probe).
  void set_statistics(MoEStatistics statistics) { stats_ = std::move(statistics); }
  CountSum take_balance_count_sum() { return std::exchange(balance_count_sum_, CountSum()); }
  // The router replicated; the stacked expert weights split along experts (expert parallelism).
  ParameterSpecs parameter_specs() const;

  Linear router{nullptr};
  // [E, C, H'], [E, H'], [E, H, C], [E, C] (H' = 2H for SwiGLU experts); biases with model.bias
  at::Tensor w_fc, b_fc, w_proj, b_proj;
  MLP shared{nullptr};  // the shared experts (model.moe_shared_experts > 0)
  Linear shared_gate{nullptr};  // [1, C] (model.moe_shared_gate)

 private:
  at::Tensor activation(const at::Tensor& h) const;  // gelu_tanh, or a * silu(g)

  // The selection scores [N, E] with the experts outside each token's best groups at -inf.
  at::Tensor within_best_groups(const at::Tensor& choice) const;

  int64_t n_experts_, top_k_, groups_, topk_groups_;
  bool sigmoid_, glu_, renormalize_;
  double capacity_factor_, aux_coef_, z_coef_, routed_scale_, residual_std_;
  RoutedStep routed_step_;
  CountSum balance_count_sum_;
  MoEStatistics stats_;
  at::Tensor selection_bias_;
};
TORCH_MODULE(MoE);

// Expert capacity for `tokens` tokens: ceil(top_k * tokens / experts * capacity_factor) (a
// positive factor; dropless routing sizes the buffer by the routed counts instead).
int64_t expert_capacity(int64_t tokens, int64_t experts, int64_t top_k, double capacity_factor);

}  // namespace tessera
