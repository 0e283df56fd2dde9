// DataParallel's gradient reductions (data_parallel.h).
//
// Gradients leave a rank in "reductions" launched in one fixed order, the
// same on every rank (collectives are matched by their order): stages 0-1 reduce buckets
// (parameters in reverse registration order, parallel.bucket_mb each, a new bucket where the
// reduction group changes), stages 2-3 reduce units (blocks last to first, then the ends, the
// order backward finishes them; a part's dense unit before its experts'), each over its own
// group. A post-accumulate-grad hook on each parameter counts arrivals; a reduction launches once
// all its parameters arrived and every reduction before it launched. Reductions whose parameters got no gradient (an expert
// no token chose) are launched at the next ordered point: before the next micro-batch, before a
// block's backward gather (stage 3) or in finish_gradients, with zeros for the missing gradients.
//
// Stages 0-1: each parameter's .grad is a view of its bucket, so backward accumulates into the
// bucket in place (AccumulateGrad adds into an existing grad when grad mode is off) and the
// bucket is all-reduced as it is. Only the last micro-batch communicates.
// Stages 2-3: every micro-batch reduce-scatters each unit's gradients as soon as the unit is
// complete and drops the full gradients, accumulating this rank's part into grad_shards (as
// DeepSpeed does with accumulation: the full gradients never outlive one unit's backward).
#include "parallel/data/data_parallel.h"

#include <set>
#include <utility>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include "core/error.h"
#include "core/gradient_ready_hook.h"
#include "parallel/data/data_parallel_impl.h"

namespace tessera {
namespace {

// Reduce-scatters of stages 2-3 that may be in flight at once; each holds a unit's full gradients.
// While a unit's gradients are flattened at most kReduceScattersInFlight - 1 are.
constexpr size_t kReduceScattersInFlight = 2;

}  // namespace

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
    set_gradient_ready_hook(params[i].second, [this, i] { grad_ready(i); });
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
  // The oldest reduction is waited for before this unit's flat gradient is made: while it is made
  // the unit's gradients are held twice (as the parameters' and flat), and a second older unit in
  // flight beside them was the backward's peak where rings outlast a block's backward (ZeRO-2/3 at
  // four replicas on this CPU: docs/plan.md).
  drain_scatters(kReduceScattersInFlight - 1);
  at::Tensor input = unit.flatten_grads();
  for (const auto& e : unit.entries()) e.param.mutable_grad().reset();
  at::Tensor output = at::empty({unit.shard_numel()}, input.options());
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
  if (offload && !holds_shares(units[unit])) offload->grads_to_host(unit);
  finalized[unit] = 1;
}

bool DataParallel::Impl::holds_shares(const FlatUnit& unit) const {
  for (const auto& e : unit.entries())
    if (shares.holds(e.name)) return true;
  return false;
}

bool DataParallel::Impl::bucket_holds_shares(size_t bucket) const {
  for (size_t i : buckets[bucket].params)
    if (shares.holds(params[i].first)) return true;
  return false;
}

// After every reduction over the replicas (the shares' sums commute with it), once a step: the
// buckets' views of the shares (stages 0-1) or this rank's owned parts of them (stages 2-3; every
// tp rank of the same replica owns the same ranges), one all-reduce per group.
void DataParallel::Impl::sum_shares() {
  if (!shares.any()) return;
  std::vector<std::pair<std::string, at::Tensor>> parts;
  if (stage <= 1) {
    for (size_t i = 0; i < params.size(); ++i)
      if (shares.holds(params[i].first)) parts.emplace_back(params[i].first, grad_views[i]);
  } else {
    for (size_t u = 0; u < units.size(); ++u)
      for (const auto& e : units[u].entries()) {
        const auto [begin, end] = units[u].owned(e);
        if (shares.holds(e.name) && begin < end) parts.emplace_back(e.name, units[u].owned_part(e, grad_shards[u]));
      }
  }
  shares.sum(parts);
  if (!offload) return;
  if (stage <= 1) {
    for (size_t b = 0; b < buckets.size(); ++b)
      if (bucket_holds_shares(b)) offload->grads_to_host(b);
  } else {
    for (size_t u = 0; u < units.size(); ++u)
      if (holds_shares(units[u])) offload->grads_to_host(u);
  }
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
      if (s.offload && !s.bucket_holds_shares(b)) s.offload->grads_to_host(b);
    }
  } else {
    // Each unit's gradient is divided by N as its last reduce-scatter is collected, or here when
    // that was in an earlier backward (another pipeline stage of this rank backed last).
    s.drain_scatters(0);
    for (size_t u = 0; u < s.units.size(); ++u)
      if (!s.finalized[u]) s.finalize(u);
    std::fill(s.finalized.begin(), s.finalized.end(), 0);
  }
  s.sum_shares();
  s.armed = false;
  s.reducing = false;
}

}  // namespace tessera
