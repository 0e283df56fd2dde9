// Freeing a tensor's memory while the tensor lives on, and giving it fresh memory later: the
// residency layer's units (memory/residency/flat_unit.h) and the swap engine's device copies
// (memory/swap/swap_owner.h) keep the model's parameters as views of one flat tensor whose storage
// comes and goes. Every view, and every tensor the autograd graph saved from one, shares the
// StorageImpl, so all of them see the memory given back by materialize_storage.
//
// materialize_meta_parameter gives a parameter built on the meta device its first real tensor,
// in place, so the modules' handles to it (their `weight` members, the named_parameters entry)
// all see it: what set_data does, without set_data's refusal of a meta -> dense change of type.
//
// Invariants: release_storage leaves the StorageImpl with 0 bytes (reading a view then is an
// error, never stale data); materialize_storage allocates with the storage's own allocator (on CUDA
// the caching allocator, on the calling thread's current stream) and does nothing when memory is
// there.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/StorageImpl.h>

namespace tessera {

inline bool storage_materialized(const at::Tensor& t) { return t.storage().nbytes() > 0; }

inline void release_storage(const at::Tensor& t) { t.storage().unsafeGetStorageImpl()->reset(); }

// Gives `t`'s storage `bytes` of fresh memory (uninitialised) if it has none.
inline void materialize_storage(const at::Tensor& t, size_t bytes) {
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  if (storage->nbytes() > 0) return;
  storage->set_data_ptr_noswap(storage->allocator()->allocate(bytes));
  storage->set_nbytes(bytes);
}

// `param` (meta, no gradient accumulator yet: never used in a backward) takes `value`'s storage,
// shape, dtype and device; its autograd identity (requires_grad, hooks, version counter) stays.
inline void materialize_meta_parameter(at::Tensor& param, const at::Tensor& value) {
  TORCH_CHECK(param.is_meta() && !param.grad().defined(), "internal: materialize_meta_parameter on a parameter that ",
              param.is_meta() ? "has a gradient" : "is not on the meta device");
  param.unsafeGetTensorImpl()->shallow_copy_from(value.getIntrusivePtr());
}

}  // namespace tessera
