// AutocastGuard, AutocastCacheScope, WeightCastCache and cast_weight (autocast.h).
#include "precision/autocast.h"

#include <unordered_map>

#include <ATen/autocast_mode.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/intrusive_ptr.h>

namespace tessera {

AutocastGuard::AutocastGuard(at::DeviceType device_type, at::ScalarType dtype, bool enabled)
    : device_type_(device_type),
      prev_enabled_(at::autocast::is_autocast_enabled(device_type)),
      prev_dtype_(at::autocast::get_autocast_dtype(device_type)),
      prev_cache_enabled_(at::autocast::is_autocast_cache_enabled()) {
  at::autocast::set_autocast_enabled(device_type, enabled);
  at::autocast::set_autocast_dtype(device_type, dtype);
  at::autocast::increment_nesting();
}

AutocastGuard::~AutocastGuard() {
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_autocast_enabled(device_type_, prev_enabled_);
  at::autocast::set_autocast_dtype(device_type_, prev_dtype_);
  at::autocast::set_autocast_cache_enabled(prev_cache_enabled_);
}

AutocastCacheScope::AutocastCacheScope() { at::autocast::increment_nesting(); }

AutocastCacheScope::~AutocastCacheScope() {
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
}

namespace {

using WeakImpl = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;

// One weight's copy: the weight and the copy held weakly, the weight's version when cast.
struct CastCopy {
  WeakImpl weight, copy;
  int64_t version;
  at::ScalarType dtype;
};

// This thread's live cache (the outermost WeightCastCache's), by the weight's TensorImpl.
thread_local std::unordered_map<const c10::TensorImpl*, CastCopy>* active = nullptr;

}  // namespace

WeightCastCache::WeightCastCache() : outermost_(active == nullptr) {
  if (outermost_) active = new std::unordered_map<const c10::TensorImpl*, CastCopy>();
}

WeightCastCache::~WeightCastCache() {
  if (!outermost_) return;
  delete active;
  active = nullptr;
}

at::Tensor cast_weight(const at::Tensor& weight, at::ScalarType dtype) {
  if (weight.scalar_type() == dtype) return weight;
  if (active == nullptr || weight.scalar_type() != at::kFloat || !weight.requires_grad() || !weight.is_leaf())
    return weight.to(dtype);
  const c10::TensorImpl* impl = weight.unsafeGetTensorImpl();
  const auto it = active->find(impl);
  if (it != active->end()) {
    const CastCopy& entry = it->second;
    if (entry.dtype == dtype && entry.version == weight._version() && entry.weight.lock().get() == impl)
      if (auto kept = entry.copy.lock()) {
        at::Tensor copy(std::move(kept));
        // A copy made without autograd history (under no-grad: a checkpointed segment's forward)
        // serves only where none is recorded.
        if (!at::GradMode::is_enabled() || copy.requires_grad()) return copy;
      }
  }
  at::Tensor copy = weight.to(dtype);
  CastCopy fresh{WeakImpl(weight.getIntrusivePtr()), WeakImpl(copy.getIntrusivePtr()), weight._version(), dtype};
  if (it != active->end()) it->second = std::move(fresh);
  else active->emplace(impl, std::move(fresh));
  return copy;
}

at::ScalarType autocast_dtype_or(c10::DeviceType device, at::ScalarType otherwise) {
  return at::autocast::is_autocast_enabled(device) ? at::autocast::get_autocast_dtype(device) : otherwise;
}

}  // namespace tessera
