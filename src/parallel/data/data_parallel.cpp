// DataParallel: construction, gradient reductions, clipping and the step, ZeRO stages 0-3
// (data_parallel.h; the state is in data_parallel_impl.h, stage 3's gathering in zero3.cpp, the
// whole-tensor optimizer state in sharded_state.cpp).
//
// Gradient reductions. Gradients leave a rank in "reductions" launched in one fixed order, the
// same on every rank (collectives are matched by their order): stages 0-1 reduce buckets
// (parameters in reverse registration order, parallel.bucket_mb each, a new bucket where the
// reduction group changes), stages 2-3 reduce units (blocks last to first, then the ends, the
// order backward finishes them; a part's dense unit before its experts'), each over its own
// group. A post-accumulate-grad hook on each parameter counts arrivals; a reduction launches once
// all its parameters arrived
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
// Optimizer (stages 1-3): one leaf per owned parameter slice, aliasing the shard, with the
// matching gradient slice (of the bucket or of grad_shards) as its .grad; weight decay follows
// the original parameter.
// Offload (parallel.offload, offload.h): the leaves alias the host masters instead, with the host
// gradients as .grad. The device gradients are copied to the host as soon as they are the dp mean:
// stage 1 per bucket in finish_gradients, stages 2-3 per unit when its reduce-scatter of the last
// micro-batch is collected (during backward). step() updates on the host, then copies the masters
// into the device shards before the parameter all-gather.
#include "parallel/data/data_parallel.h"

#include <cmath>
#include <set>
#include <utility>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "core/error.h"
#include "optim/clipping.h"
#include "parallel/data/data_parallel_impl.h"

namespace tessera {
namespace {

// Reduce-scatters of stages 2-3 that may be in flight at once; each holds a unit's full gradients.
constexpr size_t kReduceScattersInFlight = 2;

// Runs fn after AccumulateGrad has stored a parameter's gradient in .grad.
struct GradReadyHook : torch::autograd::PostAccumulateGradHook {
  explicit GradReadyHook(std::function<void()> fn) : fn(std::move(fn)) {}
  void operator()(const torch::autograd::Variable&) override { fn(); }
  std::function<void()> fn;
};

int64_t bytes_of(const at::Tensor& t) { return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0; }

}  // namespace

void check_data_parallel(const ParallelOptions& parallel, const OptimOptions& optim) {
  const int64_t stage = parallel.zero_stage;
  require(stage >= 0 && stage <= 3, "parallel.zero_stage must be 0, 1, 2 or 3 (got ", stage, ")");
  require(!parallel.offload || stage >= 1,
          "parallel.offload = true needs parallel.zero_stage = 1, 2 or 3 (got 0): ZeRO-Offload keeps this "
          "rank's shard of the optimizer on the host, and stage 0 does not shard it");
  const bool elementwise = elementwise_state(optim).shardable;
  require(!parallel.offload || elementwise, "parallel.offload = true updates this rank's shard "
          "elementwise on the host, which optim.name = ", optim.name,
          " cannot do (Adafactor factors its second moment over whole rows and columns); use optim.name = adamw or sgd");
  require(stage == 0 || elementwise, "parallel.zero_stage = ", stage,
          " shards optimizer state elementwise, which optim.name = ", optim.name,
          " cannot use (Adafactor factors its second moment over whole rows and columns); use "
          "parallel.zero_stage = 0 or optim.name = adamw or sgd");
  require(stage == 0 || parallel.grad_compression == "none", "parallel.grad_compression = ",
          parallel.grad_compression, " needs parallel.zero_stage = 0 (got ", stage,
          "): compressed gradients are all-reduced whole, not reduce-scattered");
}

DataParallel::DataParallel(TransformerLM model, ReductionGroups groups, const ParallelOptions& parallel,
                           const OptimOptions& optim, ModelParallelNorm norm, const InitialValues* initial)
    : impl_(std::make_unique<Impl>(std::move(model), groups, parallel)) {
  Impl& s = *impl_;
  check_data_parallel(parallel, optim);
  require(s.groups.size() == 1 || parallel.grad_compression == "none",
          "parallel.grad_compression = ", parallel.grad_compression,
          " with an expert-data-parallel group: the compressors keep one state over the data-parallel group");
  s.norm = std::move(norm);
  s.compressor = make_compressor(parallel);

  for (const auto& item : s.model->named_parameters()) {
    s.params.emplace_back(item.key(), item.value());
    const ParameterSpec& spec = s.model->parameter_specs().at(item.key());
    s.group_of.push_back(spec.reduce == ReductionGroup::expert_data && s.groups.size() > 1 ? 1 : 0);
  }
  const bool meta = s.model->is_meta();
  require(!meta || (s.stage == 3 && initial), "internal: DataParallel takes a model on the meta device at "
          "parallel.zero_stage = 3 with its initial values only");
  if (!meta) {
    at::NoGradGuard no_grad;  // every rank starts from its group's first rank's parameters
    for (size_t i = 0; i < s.params.size(); ++i) s.group(s.group_of[i]).broadcast(s.params[i].second, 0);
  }
  if (s.stage <= 1) s.build_buckets(parallel.bucket_mb);
  if (s.stage >= 1) s.build_units(initial);
  s.build_optimizer(optim, parallel.offload);
  s.register_hooks();
  if (s.stage == 3 && !s.model->stage().whole()) {
    // A pipeline stage: the schedule's GATHER/RELEASE hold its parts (fetch_stage, release_stage).
    s.home = std::make_unique<ShardedHome>(s.units, s.part_units);
    s.residency = std::make_unique<Residency>(*s.home);
    s.residency->release_all();
  } else if (s.stage == 3) {
    s.home = std::make_unique<ShardedHome>(s.units, s.part_units);
    s.residency = std::make_unique<Residency>(*s.home, zero3_plan(s.n_blocks));
    s.residency->release_all();
    s.block_wrapper = s.model->add_block_wrapper(
        [&s](int64_t layer, const at::Tensor& x, const TransformerLMImpl::BlockCall& inner) {
          return s.run_block(layer, x, inner);
        });
    s.end_wrapper = s.model->add_end_wrapper(
        [&s](const ModelPart& part, const std::function<void()>& inner) { s.around_end(part, inner); });
  }
}

DataParallel::~DataParallel() {
  for (auto& [name, p] : impl_->params) torch::autograd::impl::set_post_acc_grad_hooks(p, nullptr);
  if (impl_->residency && impl_->residency->planned()) {
    impl_->model->remove_block_wrapper(impl_->block_wrapper);
    impl_->model->remove_end_wrapper(impl_->end_wrapper);
  }
}

std::vector<size_t> DataParallel::Impl::parts_of(const ModelStage& st) const {
  std::vector<size_t> parts;
  for (int64_t l : st.layers(model->options())) parts.push_back(static_cast<size_t>(l));
  if (st.embedding() || st.head(model->options())) parts.push_back(static_cast<size_t>(n_blocks));
  return parts;
}

bool DataParallel::shards_parameters() const { return impl_->residency && !impl_->residency->planned(); }

void DataParallel::fetch_stage(const ModelStage& stage) {
  Impl& s = *impl_;
  if (!shards_parameters()) return;
  for (size_t part : s.parts_of(stage)) s.residency->hold(part);
}

void DataParallel::complete_stage(const ModelStage& stage) {
  Impl& s = *impl_;
  if (!shards_parameters()) return;
  for (size_t part : s.parts_of(stage)) {
    require(s.residency->holds(part) > 0, "internal: completing part ", part, " of a pipeline stage that is not held");
    s.residency->complete(part);
  }
}

void DataParallel::release_stage(const ModelStage& stage) {
  Impl& s = *impl_;
  if (!shards_parameters()) return;
  for (size_t part : s.parts_of(stage)) s.residency->drop(part);
}

void DataParallel::begin_pass() {
  fetch_stage(impl_->model->stage());
  complete_stage(impl_->model->stage());
}

void DataParallel::end_pass() { release_stage(impl_->model->stage()); }

void DataParallel::Impl::build_buckets(double bucket_mb) {
  const auto capacity = static_cast<int64_t>(bucket_mb * 1024 * 1024);
  int64_t filled = 0;
  for (size_t i = params.size(); i-- > 0;) {
    const at::Tensor& p = params[i].second;
    const bool fits = !buckets.empty() && filled < capacity && buckets.back().group == group_of[i] &&
                      params[buckets.back().params.front()].second.options().type_equal(p.options());
    if (!fits) {
      buckets.emplace_back();
      buckets.back().group = group_of[i];
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

void DataParallel::Impl::build_units(const InitialValues* initial) {
  // members[part][key]: key = the reduction group, and for a pipeline stage's tied embedding a
  // unit of its own after the ends' others (key groups.size()), so that the first and the last
  // stage shard it alike.
  const bool own_tied_unit = !(model->has_embedding() && model->has_head());
  std::vector<std::vector<std::vector<std::pair<std::string, at::Tensor>>>> members(
      static_cast<size_t>(n_blocks) + 1,
      std::vector<std::vector<std::pair<std::string, at::Tensor>>>(groups.size() + 1));
  std::vector<size_t> key_group(groups.size() + 1, 0);
  for (size_t g = 0; g < groups.size(); ++g) key_group[g] = g;
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& [name, p] = params[i];
    const ParameterSpec& spec = model->parameter_specs().at(name);
    const size_t part = spec.block >= 0 ? static_cast<size_t>(spec.block) : static_cast<size_t>(n_blocks);
    const bool tied = own_tied_unit && spec.tied;
    require(!tied || group_of[i] == 0, "internal: the tied embedding reduces over the data group");
    members[part][tied ? groups.size() : group_of[i]].emplace_back(name, p);
  }
  part_units.resize(members.size());
  for (size_t part = 0; part < members.size(); ++part)
    for (size_t key = 0; key < members[part].size(); ++key) {
      if (members[part][key].empty()) continue;
      part_units[part].push_back(units.size());
      unit_part.push_back(part);
      units.emplace_back(members[part][key], group(key_group[key]), /*own_shard=*/stage == 3, initial);
      if (initial) units.back().release();  // stage 3 from meta: one unit whole at a time
    }
  if (stage >= 2)
    for (const auto& u : units) grad_shards.push_back(at::zeros({u.shard_numel()}, u.flat().options()));
}

void DataParallel::Impl::build_optimizer(const OptimOptions& optim, bool offload_to_host) {
  state_slots = elementwise_state(optim);
  if (stage == 0) {
    optimizer = make_optimizer(optim, params);
    return;
  }
  if (offload_to_host) offload = std::make_unique<OffloadedShard>(units, params.front().second.device());
  // The shard as one leaf per parameter slice, with the matching gradient slice as its .grad (on
  // the device, or with offload on the host, filled from the device slice).
  std::map<const c10::TensorImpl*, size_t> index_of;
  for (size_t i = 0; i < params.size(); ++i) index_of[params[i].second.unsafeGetTensorImpl()] = i;
  std::vector<size_t> bucket_of(params.size());
  for (size_t b = 0; b < buckets.size(); ++b)
    for (size_t i : buckets[b].params) bucket_of[i] = b;
  NamedParams slices;
  std::vector<bool> decay;
  for (size_t u = 0; u < units.size(); ++u) {
    const FlatUnit& unit = units[u];
    for (const auto& e : unit.entries()) {
      const auto [begin, end] = unit.owned(e);
      if (begin == end) continue;
      const size_t i = index_of.at(e.param.unsafeGetTensorImpl());
      at::Tensor device_grad = stage == 1 ? grad_views[i].reshape(-1).narrow(0, begin - e.offset, end - begin)
                                          : unit.owned_part(e, grad_shards[u]);
      at::Tensor slice;
      if (offload) {
        slice = unit.owned_part(e, offload->master(u));
        slice.mutable_grad() = unit.owned_part(e, offload->grad(u));
        if (stage == 1) offload->add_grad_source(bucket_of[i], device_grad, slice.grad());
      } else {
        slice = unit.owned_part(e, unit.shard());
        slice.mutable_grad() = device_grad;
      }
      slices.emplace_back(e.name, slice);
      decay.push_back(e.decay);
    }
    if (offload && stage >= 2) offload->add_grad_source(u, grad_shards[u], offload->grad(u));
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
    std::vector<size_t> parts;
    for (auto l = model->layers().rbegin(); l != model->layers().rend(); ++l) parts.push_back(static_cast<size_t>(*l));
    parts.push_back(static_cast<size_t>(n_blocks));
    for (size_t part : parts)
      for (size_t u : part_units[part]) {
        std::vector<size_t> members;
        for (const auto& e : units[u].entries()) members.push_back(index_of.at(e.param.unsafeGetTensorImpl()));
        add(u, members);
      }
  }
  arrived.assign(params.size(), 0);
  in_window.assign(reductions.size(), 1);
  finalized.assign(units.size(), 0);
  for (size_t i = 0; i < params.size(); ++i)
    torch::autograd::impl::set_post_acc_grad_hooks(params[i].second,
                                                   std::make_unique<GradReadyHook>([this, i] { grad_ready(i); }));
}

size_t DataParallel::Impl::reductions_after_block(int64_t layer) const {
  size_t count = 0;
  for (int64_t l : model->layers())
    if (l > layer) count += part_units[static_cast<size_t>(l)].size();
  return count;
}

void DataParallel::before_backward(bool last_micro_batch) {
  Impl& s = *impl_;
  require(!(s.armed && s.reducing && s.stage <= 1),
          "internal: DataParallel::before_backward after the last micro-batch without finish_gradients");
  if (s.armed && s.reducing) s.launch_through(s.reductions.size());
  s.last_micro_batch = last_micro_batch;
  s.reducing = s.stage >= 2 || last_micro_batch;
  for (auto& r : s.reductions) r.arrived = 0;
  std::fill(s.arrived.begin(), s.arrived.end(), 0);
  s.next_launch = 0;
  s.armed = true;
  s.in_window.assign(s.reductions.size(), 1);
}

void DataParallel::before_stage_backward(bool last_micro_batch, const ModelStage& stage) {
  Impl& s = *impl_;
  before_backward(last_micro_batch);
  if (s.stage < 2) return;  // buckets mix stages, and are reduced once, after the last backward
  std::vector<char> in_stage(s.part_units.size(), 0);
  for (size_t part : s.parts_of(stage)) in_stage[part] = 1;
  for (size_t r = 0; r < s.reductions.size(); ++r) s.in_window[r] = in_stage[s.unit_part[s.reductions[r].index]];
}

void DataParallel::Impl::grad_ready(size_t param) {
  require(armed, "internal: backward ran without DataParallel::before_backward (parameter ", params[param].first, ")");
  require(stage >= 2 || params[param].second.grad().is_same(grad_views[param]), "internal: the gradient of ",
          params[param].first, " is no longer a view of its bucket (reset outside DataParallel::zero_grad)");
  if (!reducing) return;
  require(!arrived[param] && reduction_of[param] >= next_launch, "internal: a second gradient for ",
          params[param].first, " arrived after its reduction was launched");
  require(in_window[reduction_of[param]], "internal: a gradient for ", params[param].first,
          " arrived in the backward of another pipeline stage");
  arrived[param] = 1;
  ++reductions[reduction_of[param]].arrived;
  while (next_launch < reductions.size()) {
    Reduction& r = reductions[next_launch];
    if (in_window[next_launch] && r.arrived < r.expected) break;
    if (in_window[next_launch]) launch(r);
    ++next_launch;
  }
}

void DataParallel::Impl::launch_through(size_t end) {
  for (; next_launch < end; ++next_launch)
    if (in_window[next_launch]) launch(reductions[next_launch]);
}

void DataParallel::Impl::launch(const Reduction& r) {
  if (stage <= 1 && compressor) {
    buckets[r.index].work = dp.run_async("compressed reduction of bucket " + std::to_string(r.index),
                                         [this, b = r.index] { compress(b); });
    return;
  }
  if (stage <= 1) {
    Bucket& b = buckets[r.index];
    b.work = group(b.group).all_reduce_async(b.grad);
    return;
  }
  at::NoGradGuard no_grad;
  FlatUnit& unit = units[r.index];
  at::Tensor input = unit.flatten_grads();
  for (const auto& e : unit.entries()) e.param.mutable_grad().reset();
  at::Tensor output = at::empty({unit.shard_numel()}, input.options());
  drain_scatters(kReduceScattersInFlight - 1);
  scatters.push_back({unit.group().reduce_scatter_async(output, input), r.index, last_micro_batch, input, output});
  // A reduce-scatter that was complete when it returned (a one-rank group's copy) is collected at
  // once, so its unit's gradient is final (and, with offload, on its way to the host) while
  // backward goes on.
  while (!scatters.empty() && !scatters.front().work.pending()) {
    collect(scatters.front());
    scatters.pop_front();
  }
  const size_t part = unit_part[r.index];
  if (residency && residency->planned() && part_units[part].back() == r.index)  // the part's last unit
    residency->at(Pass::training, {ResidencyPoint::Kind::after_reduction,
                                   part < static_cast<size_t>(n_blocks) ? ModelPart::block(static_cast<int64_t>(part))
                                                                        : ModelPart::embedding()});
}

void DataParallel::Impl::compress(size_t bucket) {
  const std::vector<size_t>& members = buckets[bucket].params;
  std::vector<at::Tensor> grads;
  for (size_t i : members) grads.push_back(grad_views[i]);
  compressor->all_reduce_mean(grads, static_cast<int64_t>(bucket), dp);
  for (size_t j = 0; j < grads.size(); ++j)
    if (!grads[j].is_same(grad_views[members[j]])) grad_views[members[j]].copy_(grads[j]);
}

void DataParallel::Impl::drain_scatters(size_t keep) {
  while (scatters.size() > keep) {
    collect(scatters.front());
    scatters.pop_front();
  }
}

void DataParallel::Impl::collect(PendingScatter& pending) {
  at::NoGradGuard no_grad;
  pending.work.wait();
  at::Tensor& shard = grad_shards[pending.unit];
  shard.add_(pending.output);
  if (pending.last) finalize(pending.unit);
}

void DataParallel::Impl::finalize(size_t unit) {
  const int64_t n = dp.size();  // the data replicas, whatever the unit's group (data_parallel.h)
  if (n > 1) grad_shards[unit].div_(static_cast<double>(n));
  if (offload) offload->grads_to_host(unit);
  finalized[unit] = 1;
}

void DataParallel::finish_gradients() {
  Impl& s = *impl_;
  require(s.armed && s.last_micro_batch,
          "internal: DataParallel::finish_gradients without before_backward(last_micro_batch = true)");
  at::NoGradGuard no_grad;
  if (s.reducing) s.launch_through(s.reductions.size());
  if (s.stage <= 1) {
    for (size_t b = 0; b < s.buckets.size(); ++b) {
      s.buckets[b].work.wait();
      s.buckets[b].work = comm::Work();
      if (s.compressor) continue;  // the compressor's result is already the mean
      const int64_t n = s.dp.size();  // the data replicas, whatever the bucket's group (data_parallel.h)
      if (n > 1) s.buckets[b].grad.div_(static_cast<double>(n));
      if (s.offload) s.offload->grads_to_host(b);
    }
  } else {
    // Each unit's gradient is divided by N as its last reduce-scatter is collected, or here when
    // that was in an earlier backward (another pipeline stage of this rank backed last).
    s.drain_scatters(0);
    for (size_t u = 0; u < s.units.size(); ++u)
      if (!s.finalized[u]) s.finalize(u);
    std::fill(s.finalized.begin(), s.finalized.end(), 0);
  }
  s.armed = false;
  s.reducing = false;
}

double DataParallel::clip_grad_norm(double max_norm) {
  Impl& s = *impl_;
  at::NoGradGuard no_grad;
  if (s.offload) s.offload->wait();
  const at::Device device = s.params.front().second.device();
  // Scaled are the gradients the optimizer reads: with offload the host's.
  if (s.stage <= 1) {
    // The norm over the whole (all-reduced) device gradients, with or without offload.
    std::vector<at::Tensor> grads;
    double norm;
    if (s.groups.size() > 1) {
      // Each replica of a gradient counted 1/|its group| times over the data group, whose ranks
      // outside an expert group hold other experts.
      std::vector<int64_t> replicas;
      for (size_t g : s.group_of) replicas.push_back(s.group(g).size());
      norm = s.norm.grad_norm(s.params, grads, replicas, &s.dp);
    } else if (s.norm.split()) {
      norm = s.norm.grad_norm(s.params, grads);
    } else {
      std::vector<at::Tensor> tensors;
      for (const auto& [name, p] : s.params) tensors.push_back(p);
      if (!s.offload) return tessera::clip_grad_norm(tensors, max_norm);
      norm = tessera::clip_grad_norm(tensors, 0);
    }
    scale_to_max_norm(s.offload ? s.offload->grads() : grads, norm, max_norm);
    return norm;
  }
  // Every element of the gradient lives in exactly one rank's shards (the padding is zero).
  const std::vector<at::Tensor>& shards = s.offload ? s.offload->grads() : s.grad_shards;
  at::Tensor squares;
  if (!s.norm.split()) {
    squares = at::stack(at::_foreach_norm(shards, 2)).to(at::kDouble).pow(2).sum().reshape({1}).to(device);
  } else {  // each entry's owned part counted by its tensor-parallel weight
    std::vector<at::Tensor> parts;
    std::vector<double> weights;
    for (size_t u = 0; u < s.units.size(); ++u)
      for (const auto& e : s.units[u].entries()) {
        const auto [begin, end] = s.units[u].owned(e);
        if (begin == end) continue;
        parts.push_back(s.units[u].owned_part(e, shards[u]));
        weights.push_back(s.norm.weight_of(e.name));
      }
    squares = weighted_squares(parts, weights, device);
  }
  s.dp.all_reduce(squares);
  s.norm.sum_over_groups(squares);
  const double norm = std::sqrt(squares.item<double>());
  scale_to_max_norm(shards, norm, max_norm);
  return norm;
}

void DataParallel::sum_gradient_over(const std::string& name, comm::Group& copies) {
  Impl& s = *impl_;
  at::NoGradGuard no_grad;
  // With offload the sum goes to the host again (its copy there was taken in finish_gradients or
  // as the unit's last reduce-scatter was collected).
  if (s.stage <= 1) {
    for (size_t b = 0; b < s.buckets.size(); ++b)
      for (size_t i : s.buckets[b].params)
        if (s.params[i].first == name) {
          copies.all_reduce(s.grad_views[i]);
          if (s.offload) s.offload->grads_to_host(b);
          return;
        }
  } else {
    for (size_t u = 0; u < s.units.size(); ++u)
      if (s.units[u].entries().size() == 1 && s.units[u].entries().front().name == name) {
        copies.all_reduce(s.grad_shards[u]);
        if (s.offload) s.offload->grads_to_host(u);
        return;
      }
  }
  fail("internal: DataParallel has no parameter '", name, "' in a unit of its own");
}

UpdateResult DataParallel::apply(double lr, double max_norm) {
  UpdateResult result;
  result.grad_norm = at::scalar_tensor(clip_grad_norm(max_norm), at::kDouble);
  step(lr);
  zero_grad();
  return result;
}

void DataParallel::step(double lr) {
  Impl& s = *impl_;
  if (s.offload) s.offload->wait();
  s.optimizer->step(lr);
  if (s.offload) s.offload->masters_to_device(s.units);
  if (s.stage == 1 || s.stage == 2) {  // stage 3 fetches each unit at its next use
    std::vector<comm::Work> works;
    for (auto& u : s.units) works.push_back(u.gather_async());
    for (auto& w : works) w.wait();
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

}  // namespace tessera
