// AutocastGuard: a scoped autocast region for C++, which libtorch does not provide
// (libtorch-notes §5). It mirrors torch.amp.autocast's __enter__/__exit__
// (torch/amp/autocast_mode.py):
//
//   enter: save enabled(device), dtype(device), cache_enabled; set enabled and dtype;
//          increment_nesting()
//   exit:  if decrement_nesting() == 0: clear_cache(); restore the three saved values
//
// so guards nest, an inner guard with enabled = false turns autocast off for its scope, and the
// cast-weight cache is dropped when the outermost region ends. The autocast state is
// thread-local; the autograd engine carries it to its worker threads. Run backward outside.
//
// The cast-weight cache: autocast casts a float32 leaf that requires grad (a parameter, not a
// view of one) to its lower-precision dtype once and hands the same copy to every product that
// asks for it until the cache is dropped; a product's backward keeps that copy. So one forward
// region keeps one bf16 copy of each weight however many products use it.
//
// WeightCastCache: keeps that cache for its own scope rather than one forward region's. It only
// raises the autocast nesting (autocast stays as it is), so the forward regions inside it end
// without dropping the cache; it drops it at clear() and when it ends. A pipeline step holds one
// around its schedule (parallel/pipeline_step.h): every micro-batch's forward of a stage then
// shares one bf16 copy of each weight, where each held micro-batch kept its own. Only while the
// weights neither change (clear() before the optimizer updates them) nor leave the device (the
// cache would hold the copy of a released or swapped-out parameter).
//
// autocast_weight(weight, dtype): the weight in `dtype` through that cache, for code that casts a
// weight itself (a custom autograd function, a product without an autocast rule): with autocast on
// for the weight's device, the cached copy where autocast would cache one (a float32 leaf requiring
// grad, `dtype` autocast's dtype there); otherwise a plain cast (the weight itself where it is in
// `dtype` already).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

namespace tessera {

class AutocastGuard {
 public:
  AutocastGuard(at::DeviceType device_type, at::ScalarType dtype, bool enabled = true);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  at::DeviceType device_type_;
  bool prev_enabled_;
  at::ScalarType prev_dtype_;
  bool prev_cache_enabled_;
};

class WeightCastCache {
 public:
  WeightCastCache();
  ~WeightCastCache();
  WeightCastCache(const WeightCastCache&) = delete;
  WeightCastCache& operator=(const WeightCastCache&) = delete;
  void clear();
};

at::Tensor autocast_weight(const at::Tensor& weight, at::ScalarType dtype);

}  // namespace tessera
