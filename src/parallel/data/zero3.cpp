// Stage 3 of DataParallel: a block's parameters are gathered around its forward and again for its
// backward (data_parallel.h, data_parallel_impl.h).
//
//   forward of block l:   gather l (wait for its prefetch) | issue the gather of l + 1 | run l |
//                         wrap its outputs in CallInBackward | release l
//   backward reaches l's outputs (CallInBackward): launch the reductions of blocks > l (the
//                         order on the wire), gather l, issue the gather of l - 1
//   l's gradients all arrived (data_parallel.cpp): reduce-scatter them, release l
//
// The gathered storage is the same StorageImpl the forward's saved tensors point at (flat_unit.h),
// so the backward (and a full activation-checkpointing recomputation) sees the gathered values.
// reshard_parameters() lives here too: at stage 3 it takes the shards from the gathered blocks,
// and with offload (any stage) it refreshes the host master copies from the device shards.
#include <functional>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "core/error.h"
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

BlockOutput DataParallel::Impl::run_block(int64_t layer, const at::Tensor& x,
                                         const TransformerLMImpl::BlockCall& inner) {
  const auto unit = static_cast<size_t>(layer);
  gather(unit);
  if (layer + 1 < n_blocks) prefetch(unit + 1);
  BlockOutput out = inner(x);
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

void DataParallel::reshard_parameters() {
  Impl& s = *impl_;
  at::NoGradGuard no_grad;
  if (s.stage == 3) {
    for (size_t u = 0; u < s.units.size(); ++u) {
      FlatUnit& unit = s.units[u];
      require(unit.materialized() && !s.gathers[u].pending(),
              "internal: DataParallel::reshard_parameters without gather_full_parameters");
      unit.shard().copy_(unit.flat().narrow(0, s.rank * unit.shard_numel(), unit.shard_numel()));
      if (u < static_cast<size_t>(s.n_blocks)) s.release(u);
    }
  }
  if (s.offload) s.offload->masters_from_device(s.units);  // the host masters are what the optimizer updates
}

}  // namespace tessera
