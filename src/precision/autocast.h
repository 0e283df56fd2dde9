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
#pragma once

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

}  // namespace tessera
