// AutocastGuard, WeightCastCache and autocast_weight (autocast.h).
#include "precision/autocast.h"

#include <ATen/autocast_mode.h>

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

WeightCastCache::WeightCastCache() { at::autocast::increment_nesting(); }

WeightCastCache::~WeightCastCache() {
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
}

void WeightCastCache::clear() { at::autocast::clear_cache(); }

at::Tensor autocast_weight(const at::Tensor& weight, at::ScalarType dtype) {
  // Outside autocast nothing would drop a cached copy: the plain cast.
  const at::DeviceType device = weight.device().type();
  if (!at::autocast::is_autocast_enabled(device)) return weight.to(dtype);
  return at::autocast::cached_cast(dtype, weight, device);
}

}  // namespace tessera
