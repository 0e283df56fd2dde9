// Mixture of experts: routing (capacity or dropless), dispatch, stacked experts, combine (moe.h).
// Dropped choices are sent to an extra overflow row that the experts never read and whose output
// is zero, so capacity routing needs no data-dependent shapes (no host sync); dropless routing
// reads the counts on the host once per layer.
#include "model/moe.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/autograd.h>
#include <torch/types.h>

#include "core/error.h"
#include "memory/activation_checkpointing.h"
#include "model/hook_slot.h"
#include "model/norm.h"
#include "model/swiglu.h"
#include "precision/autocast.h"

namespace tessera {
namespace {

// The identity, whose backward makes the incoming gradient dense: at::_grouped_mm's backward
// refuses a zero-stride gradient (its output summed directly), which its callers cannot rule out.
struct DenseGradient : public torch::autograd::Function<DenseGradient> {
  static at::Tensor forward(torch::autograd::AutogradContext*, const at::Tensor& x) { return x.view_as(x); }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list grad) {
    return {grad[0].contiguous()};
  }
};

}  // namespace

int64_t expert_capacity(int64_t tokens, int64_t experts, int64_t top_k, double capacity_factor) {
  return static_cast<int64_t>(
      std::ceil(static_cast<double>(top_k * tokens) / static_cast<double>(experts) * capacity_factor));
}

double MoEStatistics::dropped_fraction() const {
  if (tokens == 0) return 0.0;
  return 1.0 - kept.sum().item<double>() / static_cast<double>(tokens * top_k);
}

double MoELayerStatistics::max_violation() const {
  double total = 0, most = 0;
  for (double l : load) {
    total += l;
    most = std::max(most, l);
  }
  return total > 0 ? most / (total / static_cast<double>(load.size())) - 1.0 : 0.0;
}

double MoELayerStatistics::dropped_fraction() const {
  double processed = 0;
  for (double k : kept) processed += k;
  return tokens > 0 ? 1.0 - processed / (tokens * static_cast<double>(top_k)) : 0.0;
}

ParameterSpecs MoEImpl::parameter_specs() const {
  ParameterSpecs specs = {{"router.weight", {Split::replicated, 1, normal_init(0.02)}},
                          {"w_fc", {Split::expert, 1, normal_init(0.02), ReductionGroup::expert_data}},
                          {"w_proj", {Split::expert, 1, normal_init(residual_std_), ReductionGroup::expert_data}},
                          {"b_fc", {Split::expert, 1, {}, ReductionGroup::expert_data}},
                          {"b_proj", {Split::expert, 1, {}, ReductionGroup::expert_data}}};
  if (shared) {  // the MLP's initialisation, but whole on every rank (the MoE layer is not tensor-parallel)
    ParameterSpecs mlp = shared->parameter_specs();
    for (auto& [name, spec] : mlp) {
      spec.split = Split::replicated;
      spec.parts = 1;
    }
    add_specs(specs, "shared", mlp);
  }
  if (shared_gate) specs.emplace("shared_gate.weight", ParameterSpec{Split::replicated, 1, normal_init(0.02)});
  return specs;
}

namespace {

// The options of the shared experts' MLP: S experts of the routed ones' width side by side.
ModelOptions shared_mlp_options(const ModelOptions& opts) {
  ModelOptions o = opts;
  o.ffn = "dense";
  o.mlp = opts.swiglu_experts() ? "swiglu" : "gelu";  // the routed experts' activation
  o.ffn_hidden = opts.moe_shared_experts * opts.expert_hidden();
  return o;
}

}  // namespace

MoEImpl::MoEImpl(const ModelOptions& opts, const at::TensorOptions& where)
    : n_experts_(opts.moe_experts),
      top_k_(opts.moe_top_k),
      groups_(opts.moe_groups),
      topk_groups_(opts.moe_topk_groups == 0 ? opts.moe_groups : opts.moe_topk_groups),
      sigmoid_(opts.moe_score == "sigmoid"),
      glu_(opts.swiglu_experts()),
      renormalize_(opts.renormalized_gates()),
      capacity_factor_(opts.moe_capacity_factor),
      aux_coef_(opts.moe_aux_loss_coef),
      z_coef_(opts.moe_z_loss_coef),
      routed_scale_(opts.moe_routed_scale),
      residual_std_(residual_std(opts.n_layer)) {
  const int64_t E = opts.moe_experts, C = opts.n_embd, H = opts.expert_hidden(), H_in = glu_ ? 2 * H : H;
  router = register_module("router", Linear(C, E, false, where));
  w_fc = register_parameter("w_fc", at::empty({E, C, H_in}, where));
  w_proj = register_parameter("w_proj", at::empty({E, H, C}, where));
  if (opts.bias) {
    b_fc = register_parameter("b_fc", at::empty({E, H_in}, where));
    b_proj = register_parameter("b_proj", at::empty({E, C}, where));
  }
  if (opts.moe_shared_experts > 0) shared = register_module("shared", MLP(shared_mlp_options(opts), where));
  if (opts.moe_shared_gate) shared_gate = register_module("shared_gate", Linear(C, 1, false, where));
}

at::Tensor MoEImpl::activation(const at::Tensor& h) const {
  if (!glu_) return at::gelu(h, "tanh");
  return swiglu(h);
}

void MoEImpl::set_selection_bias(at::Tensor bias) {
  require(bias.dim() == 1 && bias.size(0) == n_experts_, "the MoE selection bias has shape ", bias.sizes(),
          " for model.moe_experts = ", n_experts_);
  selection_bias_ = bias.to(at::kCPU, at::kFloat).contiguous();
}

void MoEImpl::update_selection_bias(const std::vector<double>& load, double rate) {
  require(static_cast<int64_t>(load.size()) == n_experts_, "internal: ", load.size(), " loads for ", n_experts_,
          " experts");
  double mean = 0;
  for (double l : load) mean += l / static_cast<double>(load.size());
  if (!selection_bias_.defined()) selection_bias_ = at::zeros({n_experts_}, at::kFloat);
  float* b = selection_bias_.data_ptr<float>();
  for (size_t e = 0; e < load.size(); ++e)
    b[e] += static_cast<float>(rate * (load[e] < mean ? 1.0 : load[e] > mean ? -1.0 : 0.0));
}

void MoEImpl::set_routed_step(RoutedStep step) { install_once(routed_step_, std::move(step), "the MoE routed step"); }
void MoEImpl::set_balance_count_sum(CountSum sum) {
  install_once(balance_count_sum_, std::move(sum), "the MoE balance count sum");
}

at::Tensor MoEImpl::within_best_groups(const at::Tensor& choice) const {
  const int64_t N = choice.size(0), G = groups_;
  const at::Tensor grouped = choice.view({N, G, n_experts_ / G});
  const at::Tensor group_score = std::get<0>(grouped.topk(2, -1)).sum(-1);  // [N, G]
  const at::Tensor best = std::get<1>(group_score.topk(topk_groups_, -1));  // [N, topk_groups]
  const at::Tensor reach = at::zeros({N, G}, choice.options().dtype(at::kBool)).scatter_(1, best, true);
  return grouped.masked_fill(reach.logical_not().unsqueeze(-1), -std::numeric_limits<float>::infinity())
      .view({N, n_experts_});
}

MoERouting MoEImpl::route(const at::Tensor& x) {
  const int64_t N = x.size(0), E = n_experts_, k = top_k_;
  at::Tensor logits;
  {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);  // router in float32
    logits = at::matmul(x.to(at::kFloat), router->weight.to(at::kFloat).t());     // [N, E]
  }
  const at::Tensor scores = sigmoid_ ? at::sigmoid(logits) : at::softmax(logits, -1);
  at::Tensor top_p, top_e;  // [N, k]
  if (selection_bias_.defined() || groups_ > 1) {
    at::Tensor choice = scores.detach();
    if (selection_bias_.defined()) choice = choice + selection_bias_.to(scores.device());
    if (groups_ > 1) choice = within_best_groups(choice);
    top_e = std::get<1>(choice.topk(k, -1));
    top_p = scores.gather(1, top_e);
  } else {
    std::tie(top_p, top_e) = scores.topk(k, -1);
  }
  auto gate = renormalize_ ? top_p / top_p.sum(-1, /*keepdim=*/true) : top_p;
  if (routed_scale_ != 1) gate = gate * routed_scale_;

  MoERouting r;
  auto counts = torch::zeros({E}, top_e.options());
  at::Tensor first_counts;  // [E] tokens whose first choice is each expert
  std::vector<at::Tensor> slots;
  for (int64_t c = 0; c < k; ++c) {  // first choices of all tokens, then second choices, ...
    auto onehot = at::one_hot(top_e.select(1, c), E);                              // [N, E]
    auto position = at::cumsum(onehot, 0) - 1 + counts;                            // [N, E]
    slots.push_back(position.gather(1, top_e.select(1, c).unsqueeze(1)).squeeze(1));
    counts = counts + onehot.sum(0);
    if (c == 0) first_counts = counts;
  }
  auto slot = at::stack(slots, 1);  // [N, k]
  at::Tensor size;                  // [E] rows per expert, on the device
  if (capacity_factor_ > 0) {
    r.capacity = expert_capacity(N, E, k, capacity_factor_);
    r.sizes.assign(static_cast<size_t>(E), r.capacity);
    size = torch::full({E}, r.capacity, top_e.options());
  } else {
    const at::Tensor host = counts.cpu();
    r.sizes.assign(host.data_ptr<int64_t>(), host.data_ptr<int64_t>() + E);
    r.capacity = *std::max_element(r.sizes.begin(), r.sizes.end());
    size = counts;
  }
  const at::Tensor offset = at::cumsum(size, 0) - size;  // [E] first row of each expert
  auto kept = slot < size.index({top_e});
  r.expert = top_e;
  r.slot = at::where(kept, slot, r.capacity);
  r.row = at::where(kept, offset.index({top_e}) + slot, r.rows());
  r.gate = gate * kept.to(gate.scalar_type());
  r.assigned = counts;

  // f [E]: the fraction of the counted tokens whose first choice is each expert (no gradient): this
  // forward's, or summed over the ranks routing the same micro-batch.
  at::Tensor counted = at::cat({first_counts, at::full({1}, N, top_e.options())}).to(at::kFloat);  // [E + 1]
  if (balance_count_sum_) balance_count_sum_(counted);
  const at::Tensor f = counted.narrow(0, 0, E) / counted[E];
  const at::Tensor share = sigmoid_ ? scores / scores.sum(-1, /*keepdim=*/true) : scores;
  auto balance = aux_coef_ * static_cast<double>(E) * (f * share.mean(0)).sum();
  auto z = z_coef_ * at::logsumexp(logits, -1).pow(2).mean();
  r.aux_loss = balance + z;

  if (!recomputing()) {
    const auto add = [](at::Tensor& sum, const at::Tensor& value) {
      sum = sum.defined() ? sum + value.detach() : value.detach().clone();
    };
    ++stats_.forwards;
    stats_.tokens += N;
    stats_.top_k = k;
    add(stats_.assigned, counts);
    add(stats_.kept, counts.clamp_max(r.capacity));
    add(stats_.balance_loss, balance);
    add(stats_.z_loss, z);
  }
  return r;
}

int64_t MoERouting::rows() const { return std::accumulate(sizes.begin(), sizes.end(), int64_t{0}); }

at::Tensor MoEImpl::dispatch(const at::Tensor& x, const MoERouting& r) const {
  const int64_t N = x.size(0), C = x.size(1), k = r.expert.size(1), R = r.rows();
  auto buffer = torch::zeros({R + 1, C}, x.options());  // last row: the dropped choices' overflow
  auto tokens = x.unsqueeze(1).expand({N, k, C}).reshape({N * k, C});
  buffer = buffer.index_put({r.row.reshape(-1)}, tokens);
  return buffer.narrow(0, 0, R);
}

at::Tensor MoEImpl::experts(const at::Tensor& rows, const std::vector<int64_t>& sizes) const {
  const int64_t E = w_fc.size(0), C = rows.size(1);
  require(static_cast<int64_t>(sizes.size()) == E, "internal: ", sizes.size(), " expert sizes for ", E, " experts");
  // Every path computes in autocast's dtype (_grouped_mm, which has no autocast rule, as the batched
  // matmul and the loop do), so every rank returns the same dtype; the weights cast by cast_weight
  // (precision/autocast.h), the rows by autocast or here.
  const at::ScalarType dtype = autocast_dtype_or(rows.device().type(), rows.scalar_type());
  const at::Tensor fc = cast_weight(w_fc, dtype), proj = cast_weight(w_proj, dtype);
  const at::Tensor fc_bias = b_fc.defined() ? cast_weight(b_fc, dtype) : b_fc;
  const at::Tensor proj_bias = b_proj.defined() ? cast_weight(b_proj, dtype) : b_proj;
  if (std::all_of(sizes.begin(), sizes.end(), [&](int64_t n) { return n == sizes.front(); })) {
    // Equal sizes (capacity routing): one batched matmul pair over [E, cap, C].
    const at::Tensor buffer = rows.reshape({E, sizes.front(), C});
    auto h = fc_bias.defined() ? at::baddbmm(fc_bias.unsqueeze(1), buffer, fc) : at::bmm(buffer, fc);
    h = activation(h);
    auto out = proj_bias.defined() ? at::baddbmm(proj_bias.unsqueeze(1), h, proj) : at::bmm(h, proj);
    return out.reshape({-1, C});
  }
  // Variable sizes (dropless): at::_grouped_mm over the experts' runs of rows (bench/results/
  // expert_compute_cpu.md: 1.2-2.6x faster than a matmul pair per expert, which remains for rows
  // whose strides are not 16-byte multiples, as _grouped_mm requires). An expert with no rows still
  // takes part: its gradient is zero.
  const int64_t H = w_proj.size(1);
  if ((C * rows.element_size()) % 16 == 0 && (H * rows.element_size()) % 16 == 0) {
    std::vector<int64_t> ends(sizes.size());
    std::partial_sum(sizes.begin(), sizes.end(), ends.begin());
    const at::Tensor offs = at::tensor(ends, at::kInt).to(rows.device());
    const at::Tensor expert_of_row =
        at::repeat_interleave(at::arange(E, at::kLong), at::tensor(sizes, at::kLong)).to(rows.device());
    auto h = at::_grouped_mm(rows.to(dtype), fc, offs);
    if (fc_bias.defined()) h = h + fc_bias.index_select(0, expert_of_row);
    // _grouped_mm needs its operand contiguous (GELU's output and SwiGLU's are).
    auto out = DenseGradient::apply(at::_grouped_mm(activation(h).contiguous(), proj, offs));
    return proj_bias.defined() ? out + proj_bias.index_select(0, expert_of_row) : out;
  }
  std::vector<at::Tensor> out;
  int64_t first = 0;
  for (int64_t e = 0; e < E; ++e) {
    const at::Tensor mine = rows.narrow(0, first, sizes[static_cast<size_t>(e)]);
    auto h = at::matmul(mine, fc[e]);
    if (fc_bias.defined()) h = h + fc_bias[e].to(h.scalar_type());
    h = at::matmul(activation(h), proj[e]);
    out.push_back(proj_bias.defined() ? h + proj_bias[e].to(h.scalar_type()) : h);
    first += sizes[static_cast<size_t>(e)];
  }
  return at::cat(out, 0);
}

at::Tensor MoEImpl::combine(const at::Tensor& out, const MoERouting& r) const {
  const int64_t N = r.expert.size(0), k = r.expert.size(1), C = out.size(1);
  auto padded = at::cat({out, torch::zeros({1, C}, out.options())}, 0);  // overflow row = 0
  auto picked = padded.index({r.row.reshape(-1)}).view({N, k, C});
  return (picked * r.gate.to(out.scalar_type()).unsqueeze(-1)).sum(1);
}

MoEOutput MoEImpl::forward(const at::Tensor& x) {
  const auto shape = x.sizes().vec();
  auto flat = x.reshape({-1, x.size(-1)});
  auto r = route(flat);
  const ExpertFn run = [this](const at::Tensor& rows, const std::vector<int64_t>& sizes) { return experts(rows, sizes); };
  auto y = routed_step_ ? routed_step_(flat, r, run) : combine(run(dispatch(flat, r), r.sizes), r);
  if (shared) y = y + (shared_gate ? at::sigmoid(linear(shared_gate, flat)) * shared(flat) : shared(flat));
  return {y.view(shape), r.aux_loss};
}

}  // namespace tessera
