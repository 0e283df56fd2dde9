// Stage 3 of DataParallel: every unit's parameters (a block's, and the ends': embeddings and
// final norm) are brought in around their uses by the ZeRO-3 residency plan
// (memory/residency/residency_plan.h, run by `residency`) from two kinds of wrappers:
//
//   embedding / head (end wrapper):  the plan's before_forward and after_forward points
//   block l (block wrapper):         before_forward(l) | run l | wrap its outputs in
//                                    CallInBackward | after_forward(l)
//   backward reaches l's outputs (CallInBackward): launch the reductions of blocks > l (the
//                                    order on the wire), then before_backward(l)
//   l's gradients handed to their reduce-scatter (data_parallel.cpp): after_reduction(l)
//
// During the adaptive codecs' probe (run_probe) the plan rests: a block wrapper holds the block
// around its forward and, from its CallInBackward, around its backward (until the next block's
// backward begins), launching no reduction; the ends are held through the whole probe, and each
// block's own passes run between a hold and a drop of it (around_block). So at most two blocks
// and the ends are whole at once, on every replica (the probe's gathers are collectives).
//
// The pass is training when grad mode is on at a forward point, inference otherwise (evaluation,
// generation); the backward points exist only in training. The gathered storage is the same
// StorageImpl the forward's saved tensors point at (flat_unit.h), so the backward (and a full
// activation-checkpointing recomputation) sees the gathered values.
// Loading parameters lives here too: at stage 3 a parameter's value goes into this rank's shard
// only (its owned slice), and with offload (any stage) the host master copies are refreshed from
// the device shards once every parameter is loaded.
#include <functional>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "core/error.h"
#include "model/linear.h"
#include "parallel/data/data_parallel_impl.h"

namespace tessera {
namespace {

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

}  // namespace

namespace {

Pass current_pass() { return at::GradMode::is_enabled() ? Pass::training : Pass::inference; }

// A block's run: `inner(x)` with its products keeping its float32 weights (this storage, gathered
// again before its backward) rather than 16-bit copies of them (model/linear.h), and its outputs
// wrapped so that `before_backward` runs when the backward reaches them.
BlockOutput run_wrapped(const TransformerLMImpl::BlockCall& inner, const at::Tensor& x,
                        std::function<void()> before_backward) {
  BlockOutput out = [&] {
    const KeepFloatWeightsForBackward keep;
    return inner(x);
  }();
  if (out.x.requires_grad()) {
    const bool aux = out.aux_loss.requires_grad();
    TensorList inputs{out.x};
    if (aux) inputs.push_back(out.aux_loss);
    TensorList wrapped = CallInBackward::apply(before_backward, at::TensorList(inputs));
    out.x = wrapped[0];
    if (aux) out.aux_loss = wrapped[1];
  }
  return out;
}

}  // namespace

BlockOutput DataParallel::Impl::run_block(int64_t layer, const at::Tensor& x,
                                         const TransformerLMImpl::BlockCall& inner) {
  if (probing) return probe_block(layer, x, inner);
  const Pass pass = current_pass();
  residency->at(pass, {ResidencyPoint::Kind::before_forward, ModelPart::block(layer)});
  BlockOutput out = run_wrapped(inner, x, [this, layer] { before_block_backward(layer); });
  residency->at(pass, {ResidencyPoint::Kind::after_forward, ModelPart::block(layer)});
  return out;
}

void DataParallel::Impl::around_end(const ModelPart& part, const std::function<void()>& inner) {
  if (probing) return inner();  // the ends are held through the probe
  const Pass pass = current_pass();
  residency->at(pass, {ResidencyPoint::Kind::before_forward, part});
  inner();
  residency->at(pass, {ResidencyPoint::Kind::after_forward, part});
}

void DataParallel::Impl::hold_part(size_t part) {
  for (size_t u : part_units[part]) residency->hold(u);
  for (size_t u : part_units[part]) residency->complete(u);
}

void DataParallel::Impl::drop_part(size_t part) {
  for (size_t u : part_units[part]) residency->drop(u);
}

BlockOutput DataParallel::Impl::probe_block(int64_t layer, const at::Tensor& x,
                                           const TransformerLMImpl::BlockCall& inner) {
  hold_part(static_cast<size_t>(layer));
  BlockOutput out = run_wrapped(inner, x, [this, layer] { probe_block_backward(layer); });
  drop_part(static_cast<size_t>(layer));
  return out;
}

void DataParallel::Impl::probe_block_backward(int64_t layer) {
  // The block after this one is done with its backward.
  if (probe_backward_part) drop_part(*probe_backward_part);
  hold_part(static_cast<size_t>(layer));
  probe_backward_part = static_cast<size_t>(layer);
}

bool DataParallel::probes_on_every_replica() const {
  return impl_->stage == 3 && impl_->residency && impl_->residency->planned();
}

void DataParallel::run_probe(const std::function<void(const AroundBlock& around_block)>& probe) {
  Impl& s = *impl_;
  if (!probes_on_every_replica()) return ResidentOwner::run_probe(probe);
  const size_t ends = static_cast<size_t>(s.n_blocks);
  auto drop_backward_part = [&s] {
    if (s.probe_backward_part) s.drop_part(*s.probe_backward_part);
    s.probe_backward_part.reset();
  };
  s.probing = true;
  s.hold_part(ends);
  try {
    probe([&](int64_t layer, const std::function<void()>& fn) {
      drop_backward_part();  // the census's last backward ended
      s.hold_part(static_cast<size_t>(layer));
      try {
        fn();
      } catch (...) {
        s.drop_part(static_cast<size_t>(layer));
        throw;
      }
      s.drop_part(static_cast<size_t>(layer));
    });
  } catch (...) {
    drop_backward_part();
    s.drop_part(ends);
    s.probing = false;
    throw;
  }
  drop_backward_part();
  s.drop_part(ends);
  s.probing = false;
}

void DataParallel::Impl::before_block_backward(int64_t layer) {
  // Blocks after this one are done: launch their reductions now so the order on the wire stays
  // the same on every rank, ahead of this block's gathers.
  launch_through(reductions_after_block(layer));
  residency->at(Pass::training, {ResidencyPoint::Kind::before_backward, ModelPart::block(layer)});
}

void DataParallel::visit_full_parameters(const std::function<void(const std::vector<std::string>& names)>& fn) {
  Impl& s = *impl_;
  if (s.stage < 3) {
    std::vector<std::string> names;
    for (const auto& [name, p] : s.params) names.push_back(name);
    return fn(names);
  }
  for (size_t part = 0; part < s.part_units.size(); ++part) {
    if (s.part_units[part].empty()) continue;  // a part another pipeline stage holds
    std::vector<std::string> names;
    for (size_t u : s.part_units[part])
      for (const auto& e : s.units[u].entries()) names.push_back(e.name);
    const bool was_resident = s.residency->resident(part);
    s.residency->complete(part);
    fn(names);
    if (!was_resident && s.residency->holds(part) == 0) s.residency->release(part);
  }
}

bool DataParallel::keeps_part_of(const std::string& name) const {
  const Impl& s = *impl_;
  if (s.stage < 3) return true;
  for (const FlatUnit& unit : s.units)
    for (const auto& e : unit.entries())
      if (e.name == name) {
        const auto [begin, end] = unit.owned(e);
        return begin < end;
      }
  fail("internal: DataParallel has no parameter '", name, "'");
}

void DataParallel::load_parameter(const std::string& name, const at::Tensor& value) {
  Impl& s = *impl_;
  at::NoGradGuard no_grad;
  if (s.stage < 3) {
    for (auto& [n, p] : s.params)
      if (n == name) return void(p.copy_(value));
    fail("internal: DataParallel has no parameter '", name, "'");
  }
  for (FlatUnit& unit : s.units)
    for (const auto& e : unit.entries())
      if (e.name == name) {
        require(value.numel() == e.numel, "internal: loading ", value.numel(), " values into '", name, "' of ",
                e.numel);
        const auto [begin, end] = unit.owned(e);
        if (begin < end)
          unit.owned_part(e, unit.shard()).copy_(value.reshape(-1).narrow(0, begin - e.offset, end - begin));
        if (s.residency->resident(s.unit_part[static_cast<size_t>(&unit - s.units.data())])) e.param.copy_(value);
        return;
      }
  fail("internal: DataParallel has no parameter '", name, "'");
}

void DataParallel::parameters_loaded() {
  if (impl_->offload) impl_->offload->masters_from_device(impl_->units);  // what the optimizer updates
}

}  // namespace tessera
