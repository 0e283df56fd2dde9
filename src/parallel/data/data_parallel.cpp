// DataParallel: the check, construction (buckets, units, the optimizer over this rank's slices)
// and the stages' fetches under a pipeline (data_parallel.h; the state is in data_parallel_impl.h,
// the gradient reductions in data_parallel_reduce.cpp, clipping and the step in
// data_parallel_step.cpp, stage 3's gathering in zero3.cpp, the whole-tensor optimizer state in
// sharded_state.cpp).
//
// Optimizer (stages 1-3): one leaf per owned parameter slice, aliasing the shard, with the
// matching gradient slice (of the bucket or of grad_shards) as its .grad; weight decay follows
// the original parameter.
// Offload (parallel.offload, offload.h): the leaves alias the host masters instead, with the host
// gradients as .grad. The device gradients are copied to the host as soon as they are the dp mean:
// stage 1 per bucket in finish_gradients, stages 2-3 per unit when its reduce-scatter of the last
// micro-batch is collected (during backward). step() updates on the host, then copies the masters
// into the device shards before the parameter all-gather.
#include "parallel/data/data_parallel.h"

#include <utility>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include "core/error.h"
#include "core/gradient_ready_hook.h"
#include "parallel/data/data_parallel_impl.h"

namespace tessera {
namespace {

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
                           const OptimOptions& optim, ModelParallelNorm norm, GradientShares shares,
                           const InitialValues* initial)
    : impl_(std::make_unique<Impl>(std::move(model), groups, parallel)) {
  Impl& s = *impl_;
  check_data_parallel(parallel, optim);
  require(s.groups.size() == 1 || parallel.grad_compression == "none",
          "parallel.grad_compression = ", parallel.grad_compression,
          " with an expert-data-parallel group: the compressors keep one state over the data-parallel group");
  s.norm = std::move(norm);
  s.shares = std::move(shares);
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
    // The whole model: each block's parts are gathered around its forward and backward by the
    // block wrapper, ahead on the residency plan (zero3_plan), the ends around the step's ends.
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
  for (auto& [name, p] : impl_->params) set_gradient_ready_hook(p, {});
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

bool DataParallel::gathers_by_schedule() const { return impl_->residency && !impl_->residency->planned(); }

void DataParallel::fetch_stage(const ModelStage& stage) {
  Impl& s = *impl_;
  if (!gathers_by_schedule()) return;
  for (size_t part : s.parts_of(stage)) s.residency->hold(part);
}

void DataParallel::complete_stage(const ModelStage& stage) {
  Impl& s = *impl_;
  if (!gathers_by_schedule()) return;
  for (size_t part : s.parts_of(stage)) {
    require(s.residency->holds(part) > 0, "internal: completing part ", part, " of a pipeline stage that is not held");
    s.residency->complete(part);
  }
}

void DataParallel::release_stage(const ModelStage& stage) {
  Impl& s = *impl_;
  if (!gathers_by_schedule()) return;
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

}  // namespace tessera
