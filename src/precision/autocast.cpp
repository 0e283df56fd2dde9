// AutocastGuard, AutocastCacheScope, WeightCastCache and cast_weight (autocast.h).
#include "precision/autocast.h"

#include <unordered_map>
#include <vector>

#include <ATen/autocast_mode.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/autograd/custom_function.h>

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
using WeakStorage = c10::weak_intrusive_ptr<c10::StorageImpl>;

// One weight's copy: the weight held weakly, the copy's storage held weakly with its geometry, the
// weight's version when cast.
struct CastCopy {
  WeakImpl weight;
  WeakStorage storage;
  std::vector<int64_t> sizes, strides;
  int64_t offset;
  int64_t version;
  at::ScalarType dtype;
};

// This thread's live cache (the outermost WeightCastCache's), by the weight's TensorImpl.
thread_local std::unordered_map<const c10::TensorImpl*, CastCopy>* active = nullptr;

// The cast of one product's use: its forward hands on the shared copy (a tensor of its own on the
// copy's storage), its backward casts the gradient back to the weight's float32 as a cast's does.
// Each forward makes its own node, numbered where the product asks for it, so the autograd engine
// runs it as soon as that product's backward has: a node shared by every micro-batch's graph
// would be numbered in the first micro-batch's forward and run last in each backward, holding
// the 16-bit gradients of all the stage's weights until then and delaying their accumulation
// (and data parallelism's reductions, which start there) to the backward's end.
class SharedCast : public torch::autograd::Function<SharedCast> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& weight, at::Tensor* copy) {
    ctx->saved_data["dtype"] = static_cast<int64_t>(weight.scalar_type());
    return *copy;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    return {grads[0].to(static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt())), at::Tensor()};
  }
};

// A tensor of its own on `entry`'s storage, or undefined when nothing keeps that storage.
at::Tensor on_kept_storage(const CastCopy& entry, const at::Tensor& weight) {
  c10::intrusive_ptr<c10::StorageImpl> kept = entry.storage.lock();
  if (!kept) return {};
  at::NoGradGuard no_grad;
  at::Tensor copy = at::empty({0}, weight.options().dtype(entry.dtype));
  copy.set_(c10::Storage(std::move(kept)), entry.offset, entry.sizes, entry.strides);
  return copy;
}

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
  auto it = active->find(impl);
  at::Tensor copy;
  if (it != active->end() && it->second.dtype == dtype && it->second.version == weight._version() &&
      it->second.weight.lock().get() == impl)
    copy = on_kept_storage(it->second, weight);
  if (!copy.defined()) {
    {
      at::NoGradGuard no_grad;
      copy = weight.to(dtype);
    }
    CastCopy fresh{WeakImpl(weight.getIntrusivePtr()), copy.storage().getWeakStorageImpl(), copy.sizes().vec(),
                   copy.strides().vec(), copy.storage_offset(), weight._version(), dtype};
    if (it != active->end()) it->second = std::move(fresh);
    else active->emplace(impl, std::move(fresh));
  }
  if (!at::GradMode::is_enabled()) return copy;
  return SharedCast::apply(weight, &copy);
}

at::ScalarType autocast_dtype_or(c10::DeviceType device, at::ScalarType otherwise) {
  return at::autocast::is_autocast_enabled(device) ? at::autocast::get_autocast_dtype(device) : otherwise;
}

}  // namespace tessera
