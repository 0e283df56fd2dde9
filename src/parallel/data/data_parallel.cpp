// DataParallel: ZeRO stages 0-3 over the dp group (data_parallel.h).
//
// Gradient reductions. Gradients leave a rank in "reductions" launched in one fixed order, the
// same on every rank (collectives are matched by their order): stages 0-1 reduce buckets
// (parameters in reverse registration order, parallel.bucket_mb each), stages 2-3 reduce units
// (blocks last to first, then the rest, the order backward finishes them). A post-accumulate-grad
// hook on each parameter counts arrivals; a reduction launches once all its parameters arrived
// and every reduction before it launched. Reductions whose parameters got no gradient (an expert
// no token chose) are launched at the next ordered point: before the next micro-batch, before a
// block's backward gather (stage 3) or in finish_gradients, with zeros for the missing gradients.
//
// Stages 0-1: each parameter's .grad is a view of its bucket, so backward accumulates into the
// bucket in place (AccumulateGrad adds into an existing grad when grad mode is off) and the
// bucket is all-reduced as it is. Only the last micro-batch communicates.
// Stages 2-3: every micro-batch reduce-scatters each unit's gradients as soon as the unit is
// complete and drops the full gradients, accumulating this rank's part into grad_shards (as
// DeepSpeed does with accumulation: the full gradients never outlive one unit's backward).
// Stage 3: TransformerLM's block runner gathers block l before its forward (prefetching l + 1)
// and releases it after; an identity autograd function at the block's outputs gathers it again
// when backward reaches them (prefetching l - 1), and the unit is released when its gradients
// are reduce-scattered. The rest unit (embeddings, final norm) stays gathered: it is used at both
// ends of the forward pass.
#include "parallel/data/data_parallel.h"

#include <cmath>
#include <deque>
#include <set>
#include <utility>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "core/error.h"
#include "optim/clipping.h"
#include "optim/compression/compressor.h"
#include "parallel/data/flat_unit.h"

namespace tessera {
namespace {

// Reduce-scatters of stages 2-3 that may be in flight at once; each holds a unit's full gradients.
constexpr size_t kReduceScattersInFlight = 2;

// Slots of AdamW state: elementwise ones are sharded like the parameters, the scalar step is not.
// (Sharded stages run AdamW only: Adafactor's factored state spans whole rows and columns.)
const std::vector<std::string> kElementwiseSlots{"exp_avg", "exp_avg_sq"};
const std::string kStepSlot = "step";

struct GradReadyHook : torch::autograd::PostAccumulateGradHook {
  explicit GradReadyHook(std::function<void()> fn) : fn(std::move(fn)) {}
  void operator()(const torch::autograd::Variable&) override { fn(); }
  std::function<void()> fn;
};

struct BackwardCallback : torch::CustomClassHolder {
  std::function<void()> fn;
};

// Identity in forward; in backward, runs the callback before passing the gradients on, i.e. just
// before backward enters the part of the graph that produced the inputs.
struct CallInBackward : public torch::autograd::Function<CallInBackward> {
  static TensorList forward(torch::autograd::AutogradContext* ctx, const std::function<void()>& fn,
                            at::TensorList inputs) {
    auto callback = c10::make_intrusive<BackwardCallback>();
    callback->fn = fn;
    ctx->saved_data["callback"] = c10::IValue::make_capsule(callback);
    return inputs.vec();
  }
  static TensorList backward(torch::autograd::AutogradContext* ctx, TensorList grads) {
    c10::static_intrusive_pointer_cast<BackwardCallback>(ctx->saved_data["callback"].toCapsule())->fn();
    TensorList out{at::Tensor()};  // fn is not a tensor
    out.insert(out.end(), grads.begin(), grads.end());
    return out;
  }
};

int64_t bytes_of(const at::Tensor& t) { return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0; }

}  // namespace

struct DataParallel::Impl {
  struct Bucket {
    std::vector<size_t> params;  // indices into `params`
    at::Tensor grad;             // [sum of numel]: the parameters' .grad are views of it
    comm::Work work;
  };
  struct Reduction {
    size_t index;  // bucket (stages 0-1) or unit (stages 2-3)
    int64_t expected, arrived = 0;
  };
  struct PendingScatter {
    comm::Work work;
    size_t unit;
    at::Tensor input, output;  // [N * S] full gradients, [S] this rank's sum
  };

  TransformerLM model;
  comm::Group& dp;
  int64_t stage, world, rank, n_blocks;
  NamedParams params;  // the model's, in registration order
  std::unique_ptr<Optimizer> optimizer;
  std::unique_ptr<GradientCompressor> compressor;

  std::vector<Bucket> buckets;          // stages 0-1
  std::vector<at::Tensor> grad_views;   // stages 0-1: per parameter, its .grad (a view of its bucket)
  std::vector<FlatUnit> units;          // stages 1-3: blocks 0..n_blocks-1, then the rest
  std::vector<at::Tensor> grad_shards;  // stages 2-3: per unit, [S]
  std::vector<comm::Work> gathers;      // stage 3: per unit, a gather in flight

  std::vector<Reduction> reductions;  // in launch order
  std::vector<size_t> reduction_of;   // per parameter
  std::vector<char> arrived;          // per parameter, in this backward
  size_t next_launch = 0;
  bool armed = false;     // before_backward was called and finish_gradients not yet
  bool reducing = false;  // this backward's gradients are reduced
  std::deque<PendingScatter> scatters;

  Impl(TransformerLM m, comm::Group& group, const ParallelOptions& parallel)
      : model(std::move(m)),
        dp(group),
        stage(parallel.zero_stage),
        world(group.size()),
        rank(group.rank()),
        n_blocks(model->options().n_layer) {}

  void build_buckets(double bucket_mb);
  void build_units();
  void build_optimizer(const OptimOptions& optim);
  void register_hooks();

  void grad_ready(size_t param);
  void launch_through(size_t end);
  void launch(const Reduction& r);
  void drain_scatters(size_t keep);

  // Stage 3.
  BlockOutput run_block(int64_t layer, const at::Tensor& x);
  void before_block_backward(int64_t layer);
  void gather(size_t unit);
  void prefetch(size_t unit);
  void release(size_t unit);
};

DataParallel::DataParallel(TransformerLM model, comm::Group& dp, const ParallelOptions& parallel,
                           const OptimOptions& optim)
    : impl_(std::make_unique<Impl>(std::move(model), dp, parallel)) {
  Impl& s = *impl_;
  require(s.stage >= 0 && s.stage <= 3, "parallel.zero_stage must be 0, 1, 2 or 3 (got ", s.stage, ")");
  require(s.stage == 0 || optim.name == "adamw", "parallel.zero_stage = ", s.stage,
          " shards optimizer state elementwise, which optim.name = ", optim.name,
          " cannot use (Adafactor factors its second moment over whole rows and columns); use "
          "parallel.zero_stage = 0 or optim.name = adamw");
  require(s.stage == 0 || parallel.grad_compression == "none", "parallel.grad_compression = ",
          parallel.grad_compression, " needs parallel.zero_stage = 0 (got ", s.stage,
          "): compressed gradients are all-reduced whole, not reduce-scattered");
  require(!parallel.offload, "parallel.offload = true is not supported by data parallelism (ZeRO-Offload)");
  s.compressor = make_compressor(parallel);

  for (const auto& item : s.model->named_parameters()) s.params.emplace_back(item.key(), item.value());
  {
    at::NoGradGuard no_grad;  // every rank starts from rank 0's parameters
    for (auto& [name, p] : s.params) dp.broadcast(p, 0);
  }
  if (s.stage <= 1) s.build_buckets(parallel.bucket_mb);
  if (s.stage >= 1) s.build_units();
  s.build_optimizer(optim);
  s.register_hooks();
  if (s.stage == 3) {
    s.gathers.resize(s.units.size());
    for (int64_t l = 0; l < s.n_blocks; ++l) s.release(static_cast<size_t>(l));
    s.model->set_block_runner([&s](int64_t layer, const at::Tensor& x) { return s.run_block(layer, x); });
  }
}

DataParallel::~DataParallel() {
  for (auto& [name, p] : impl_->params) torch::autograd::impl::set_post_acc_grad_hooks(p, nullptr);
  if (impl_->stage == 3) impl_->model->set_block_runner(nullptr);
}

void DataParallel::Impl::build_buckets(double bucket_mb) {
  const auto capacity = static_cast<int64_t>(bucket_mb * 1024 * 1024);
  int64_t filled = 0;
  for (size_t i = params.size(); i-- > 0;) {
    const at::Tensor& p = params[i].second;
    const bool fits = !buckets.empty() && filled < capacity &&
                      params[buckets.back().params.front()].second.options().type_equal(p.options());
    if (!fits) {
      buckets.emplace_back();
      filled = 0;
    }
    buckets.back().params.push_back(i);
    filled += bytes_of(p);
  }
  grad_views.resize(params.size());
  at::NoGradGuard no_grad;
  for (auto& b : buckets) {
    int64_t numel = 0;
    for (size_t i : b.params) numel += params[i].second.numel();
    b.grad = at::zeros({numel}, params[b.params.front()].second.options());
    int64_t offset = 0;
    for (size_t i : b.params) {
      at::Tensor& p = params[i].second;
      grad_views[i] = b.grad.narrow(0, offset, p.numel()).view(p.sizes());
      p.mutable_grad() = grad_views[i];
      offset += p.numel();
    }
  }
}

void DataParallel::Impl::build_units() {
  std::vector<std::set<const c10::TensorImpl*>> in_block(static_cast<size_t>(n_blocks));
  for (int64_t l = 0; l < n_blocks; ++l)
    for (const auto& p : model->block(l)->parameters()) in_block[l].insert(p.unsafeGetTensorImpl());
  std::vector<std::vector<std::pair<std::string, at::Tensor>>> members(static_cast<size_t>(n_blocks) + 1);
  for (const auto& [name, p] : params) {
    size_t unit = static_cast<size_t>(n_blocks);
    for (size_t l = 0; l < in_block.size(); ++l)
      if (in_block[l].count(p.unsafeGetTensorImpl())) unit = l;
    members[unit].emplace_back(name, p);
  }
  for (const auto& m : members) units.emplace_back(m, world, rank, /*own_shard=*/stage == 3);
  if (stage >= 2)
    for (const auto& u : units) grad_shards.push_back(at::zeros({u.shard_numel()}, u.flat().options()));
}

void DataParallel::Impl::build_optimizer(const OptimOptions& optim) {
  if (stage == 0) {
    optimizer = make_optimizer(optim, params);
    return;
  }
  // The shard as one leaf per parameter slice, with the matching gradient slice as its .grad.
  std::map<const c10::TensorImpl*, size_t> index_of;
  for (size_t i = 0; i < params.size(); ++i) index_of[params[i].second.unsafeGetTensorImpl()] = i;
  NamedParams slices;
  std::vector<bool> decay;
  for (size_t u = 0; u < units.size(); ++u) {
    const FlatUnit& unit = units[u];
    for (const auto& e : unit.entries()) {
      const auto [begin, end] = unit.owned(e);
      if (begin == end) continue;
      at::Tensor slice = unit.owned_part(e, unit.shard());
      if (stage == 1)
        slice.mutable_grad() = grad_views[index_of.at(e.param.unsafeGetTensorImpl())].reshape(-1).narrow(
            0, begin - e.offset, end - begin);
      else
        slice.mutable_grad() = unit.owned_part(e, grad_shards[u]);
      slices.emplace_back(e.name, slice);
      decay.push_back(e.decay);
    }
  }
  optimizer = make_optimizer(optim, std::move(slices), std::move(decay));
}

void DataParallel::Impl::register_hooks() {
  std::map<const c10::TensorImpl*, size_t> index_of;
  for (size_t i = 0; i < params.size(); ++i) index_of[params[i].second.unsafeGetTensorImpl()] = i;
  reduction_of.resize(params.size());
  auto add = [&](size_t index, const std::vector<size_t>& members) {
    for (size_t i : members) reduction_of[i] = reductions.size();
    reductions.push_back({index, static_cast<int64_t>(members.size())});
  };
  if (stage <= 1) {
    for (size_t b = 0; b < buckets.size(); ++b) add(b, buckets[b].params);
  } else {
    std::vector<size_t> order;
    for (int64_t l = n_blocks - 1; l >= 0; --l) order.push_back(static_cast<size_t>(l));
    order.push_back(static_cast<size_t>(n_blocks));
    for (size_t u : order) {
      std::vector<size_t> members;
      for (const auto& e : units[u].entries()) members.push_back(index_of.at(e.param.unsafeGetTensorImpl()));
      add(u, members);
    }
  }
  arrived.assign(params.size(), 0);
  for (size_t i = 0; i < params.size(); ++i)
    torch::autograd::impl::set_post_acc_grad_hooks(params[i].second,
                                                   std::make_unique<GradReadyHook>([this, i] { grad_ready(i); }));
}

void DataParallel::before_backward(bool last_micro_batch) {
  Impl& s = *impl_;
  require(!(s.armed && s.reducing && s.stage <= 1),
          "internal: DataParallel::before_backward after the last micro-batch without finish_gradients");
  if (s.armed && s.reducing) s.launch_through(s.reductions.size());
  s.reducing = s.stage >= 2 || (last_micro_batch && !s.compressor);
  for (auto& r : s.reductions) r.arrived = 0;
  std::fill(s.arrived.begin(), s.arrived.end(), 0);
  s.next_launch = 0;
  s.armed = true;
}

void DataParallel::Impl::grad_ready(size_t param) {
  require(armed, "internal: backward ran without DataParallel::before_backward (parameter ", params[param].first, ")");
  require(stage >= 2 || params[param].second.grad().is_same(grad_views[param]), "internal: the gradient of ",
          params[param].first, " is no longer a view of its bucket (reset outside DataParallel::zero_grad)");
  if (!reducing) return;
  require(!arrived[param] && reduction_of[param] >= next_launch, "internal: a second gradient for ",
          params[param].first, " arrived after its reduction was launched");
  arrived[param] = 1;
  ++reductions[reduction_of[param]].arrived;
  while (next_launch < reductions.size() && reductions[next_launch].arrived == reductions[next_launch].expected)
    launch(reductions[next_launch++]);
}

void DataParallel::Impl::launch_through(size_t end) {
  while (next_launch < end) launch(reductions[next_launch++]);
}

void DataParallel::Impl::launch(const Reduction& r) {
  if (stage <= 1) {
    buckets[r.index].work = dp.all_reduce_async(buckets[r.index].grad);
    return;
  }
  FlatUnit& unit = units[r.index];
  at::Tensor input = unit.flatten_grads();
  for (const auto& e : unit.entries()) e.param.mutable_grad().reset();
  at::Tensor output = at::empty({unit.shard_numel()}, input.options());
  drain_scatters(kReduceScattersInFlight - 1);
  scatters.push_back({dp.reduce_scatter_async(output, input), r.index, input, output});
  if (stage == 3 && r.index < static_cast<size_t>(n_blocks)) release(r.index);
}

void DataParallel::Impl::drain_scatters(size_t keep) {
  at::NoGradGuard no_grad;
  while (scatters.size() > keep) {
    scatters.front().work.wait();
    grad_shards[scatters.front().unit].add_(scatters.front().output);
    scatters.pop_front();
  }
}

void DataParallel::finish_gradients() {
  Impl& s = *impl_;
  require(s.armed, "internal: DataParallel::finish_gradients without before_backward");
  at::NoGradGuard no_grad;
  if (s.reducing) s.launch_through(s.reductions.size());
  if (s.stage <= 1) {
    for (size_t b = 0; b < s.buckets.size(); ++b) {
      if (s.compressor) {
        std::vector<at::Tensor> grads;
        for (size_t i : s.buckets[b].params) grads.push_back(s.grad_views[i]);
        s.compressor->all_reduce_mean(grads, static_cast<int64_t>(b), s.dp);
        for (size_t j = 0; j < grads.size(); ++j)
          if (!grads[j].is_same(s.grad_views[s.buckets[b].params[j]])) s.grad_views[s.buckets[b].params[j]].copy_(grads[j]);
      } else {
        s.buckets[b].work.wait();
        s.buckets[b].work = comm::Work();
        if (s.world > 1) s.buckets[b].grad.div_(static_cast<double>(s.world));
      }
    }
  } else {
    s.drain_scatters(0);
    if (s.world > 1)
      for (auto& g : s.grad_shards) g.div_(static_cast<double>(s.world));
  }
  s.armed = false;
  s.reducing = false;
}

double DataParallel::clip_grad_norm(double max_norm) {
  Impl& s = *impl_;
  if (s.stage <= 1) {
    std::vector<at::Tensor> tensors;
    for (const auto& [name, p] : s.params) tensors.push_back(p);
    return tessera::clip_grad_norm(tensors, max_norm);
  }
  // Every element of the gradient lives in exactly one rank's shards (the padding is zero).
  at::NoGradGuard no_grad;
  at::Tensor squares = at::stack(at::_foreach_norm(s.grad_shards, 2)).to(at::kDouble).pow(2).sum().reshape({1});
  s.dp.all_reduce(squares);
  const double norm = std::sqrt(squares.item<double>());
  if (max_norm > 0 && std::isfinite(norm) && norm > max_norm)
    at::_foreach_mul_(s.grad_shards, at::Scalar(max_norm / (norm + 1e-6)));
  return norm;
}

void DataParallel::step(double lr) {
  Impl& s = *impl_;
  s.optimizer->step(lr);
  if (s.stage == 1 || s.stage == 2) {
    std::vector<comm::Work> works;
    for (auto& u : s.units) works.push_back(u.gather_async(s.dp));
    for (auto& w : works) w.wait();
  } else if (s.stage == 3) {
    s.units.back().gather_async(s.dp).wait();
  }
}

void DataParallel::zero_grad() {
  Impl& s = *impl_;
  at::NoGradGuard no_grad;
  if (s.stage <= 1) {
    for (auto& b : s.buckets) b.grad.zero_();
    for (size_t i = 0; i < s.params.size(); ++i) s.params[i].second.mutable_grad() = s.grad_views[i];
    return;
  }
  for (auto& g : s.grad_shards) g.zero_();
  for (auto& [name, p] : s.params) p.mutable_grad().reset();
}

BlockOutput DataParallel::Impl::run_block(int64_t layer, const at::Tensor& x) {
  const auto unit = static_cast<size_t>(layer);
  gather(unit);
  if (layer + 1 < n_blocks) prefetch(unit + 1);
  BlockOutput out = model->block(layer)(x);
  if (out.x.requires_grad()) {
    const bool aux = out.aux_loss.requires_grad();
    TensorList inputs{out.x};
    if (aux) inputs.push_back(out.aux_loss);
    TensorList wrapped =
        CallInBackward::apply(std::function<void()>([this, layer] { before_block_backward(layer); }),
                              at::TensorList(inputs));
    out.x = wrapped[0];
    if (aux) out.aux_loss = wrapped[1];
  }
  release(unit);
  return out;
}

void DataParallel::Impl::before_block_backward(int64_t layer) {
  // Blocks after this one are done: launch their reductions now so the order on the wire stays
  // the same on every rank, ahead of this block's gathers.
  launch_through(static_cast<size_t>(n_blocks - 1 - layer));
  gather(static_cast<size_t>(layer));
  if (layer > 0) prefetch(static_cast<size_t>(layer - 1));
}

void DataParallel::Impl::gather(size_t unit) {
  if (gathers[unit].pending()) {
    gathers[unit].wait();
    gathers[unit] = comm::Work();
    return;
  }
  if (units[unit].materialized()) return;
  units[unit].materialize();
  units[unit].gather_async(dp).wait();
}

void DataParallel::Impl::prefetch(size_t unit) {
  if (gathers[unit].pending() || units[unit].materialized()) return;
  units[unit].materialize();
  gathers[unit] = units[unit].gather_async(dp);
}

void DataParallel::Impl::release(size_t unit) {
  if (gathers[unit].pending()) {
    gathers[unit].wait();
    gathers[unit] = comm::Work();
  }
  units[unit].release();
}

void DataParallel::gather_full_parameters() {
  Impl& s = *impl_;
  if (s.stage < 3) return;
  for (int64_t l = 0; l < s.n_blocks; ++l) s.prefetch(static_cast<size_t>(l));
  for (int64_t l = 0; l < s.n_blocks; ++l) s.gather(static_cast<size_t>(l));
}

NamedParams DataParallel::full_optimizer_state() {
  Impl& s = *impl_;
  if (s.stage == 0) return s.optimizer->state();
  std::map<std::string, at::Tensor> mine;
  for (auto& [name, t] : s.optimizer->state()) mine[name] = t;
  std::map<std::string, at::Tensor> whole;
  // Elementwise slots: each unit's shards gathered. Steps: the max over ranks (those owning none
  // of a parameter report 0; the owners agree).
  at::Tensor steps = at::zeros({static_cast<int64_t>(s.params.size())}, at::kFloat);
  std::map<std::string, int64_t> position;
  for (size_t i = 0; i < s.params.size(); ++i) position[s.params[i].first] = static_cast<int64_t>(i);
  for (const auto& unit : s.units) {
    for (const auto& slot : kElementwiseSlots) {
      auto tensors = unit.gather_entries(
          s.dp,
          [&](const FlatUnit::Entry& e) {
            auto it = mine.find(e.name + "." + slot);
            return it == mine.end() ? at::Tensor() : it->second;
          },
          unit.flat().options());
      for (size_t j = 0; j < tensors.size(); ++j) whole[unit.entries()[j].name + "." + slot] = tensors[j];
    }
    for (const auto& e : unit.entries()) {
      auto it = mine.find(e.name + "." + kStepSlot);
      if (it != mine.end()) steps[position.at(e.name)] = it->second.item<float>();
    }
  }
  const at::Device device = s.params.front().second.device();
  at::Tensor all_steps = steps.to(device);
  s.dp.all_reduce(all_steps, comm::ReduceOp::max);
  NamedParams out;
  for (size_t i = 0; i < s.params.size(); ++i) {
    const std::string& name = s.params[i].first;
    for (const auto& slot : kElementwiseSlots) out.emplace_back(name + "." + slot, whole.at(name + "." + slot));
    out.emplace_back(name + "." + kStepSlot, all_steps[static_cast<int64_t>(i)].clone());
  }
  return out;
}

void DataParallel::load_full_optimizer_state(const std::map<std::string, at::Tensor>& state,
                                             const std::string& source) {
  Impl& s = *impl_;
  if (s.stage == 0) return s.optimizer->load_state(state, source);
  std::set<std::string> expected;
  for (const auto& [name, p] : s.params) {
    for (const auto& slot : kElementwiseSlots) {
      auto it = state.find(name + "." + slot);
      require(it != state.end(), source, ": optimizer state ", name, ".", slot, " is missing");
      require(it->second.sizes() == p.sizes(), source, ": optimizer state ", name, ".", slot, " has shape ",
              it->second.sizes(), ", expected ", p.sizes());
      expected.insert(name + "." + slot);
    }
    auto it = state.find(name + "." + kStepSlot);
    require(it != state.end() && it->second.numel() == 1, source, ": optimizer state ", name, ".", kStepSlot,
            " is missing or not a scalar");
    expected.insert(name + "." + kStepSlot);
  }
  for (const auto& entry : state)
    require(expected.count(entry.first) > 0, source, ": unexpected optimizer state ", entry.first,
            " (no such parameter slot)");
  std::map<std::string, at::Tensor> mine;
  for (const auto& unit : s.units) {
    for (const auto& e : unit.entries()) {
      const auto [begin, end] = unit.owned(e);
      if (begin == end) continue;
      for (const auto& slot : kElementwiseSlots)
        mine[e.name + "." + slot] = state.at(e.name + "." + slot).reshape(-1).narrow(0, begin - e.offset, end - begin);
      mine[e.name + "." + kStepSlot] = state.at(e.name + "." + kStepSlot).reshape({});
    }
  }
  s.optimizer->load_state(mine, source);
}

NamedParams DataParallel::compression_state() const {
  return impl_->compressor ? impl_->compressor->state() : NamedParams{};
}

void DataParallel::load_compression_state(const std::map<std::string, at::Tensor>& state, const std::string& source) {
  if (impl_->compressor) return impl_->compressor->load_state(state, source);
  require(state.empty(), source, ": gradient-compression state ", state.empty() ? "" : state.begin()->first,
          " given, but parallel.grad_compression = none");
}

DataParallel::Memory DataParallel::memory() const {
  const Impl& s = *impl_;
  Memory m;
  if (s.stage == 0)
    for (const auto& [name, p] : s.params) m.parameters += bytes_of(p);
  for (const auto& u : s.units) m.parameters += (s.stage == 3 ? bytes_of(u.shard()) : 0) + u.flat_bytes();
  for (const auto& b : s.buckets) m.gradients += bytes_of(b.grad);
  for (const auto& g : s.grad_shards) m.gradients += bytes_of(g);
  if (s.stage >= 2) {
    for (const auto& [name, p] : s.params) m.gradients += bytes_of(p.grad());
    for (const auto& pending : s.scatters) m.gradients += bytes_of(pending.input) + bytes_of(pending.output);
  }
  for (const auto& [name, t] : s.optimizer->state()) m.optimizer += bytes_of(t);
  return m;
}

}  // namespace tessera
