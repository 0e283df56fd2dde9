// AutocastGuard, AutocastCacheScope, WeightCastCache and cast_weight (autocast.h).
#include "precision/autocast.h"

#include <algorithm>
#include <unordered_map>
#include <vector>

#include <ATen/ATen.h>
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

// One copy: of a weight, or of weights joined along dim 0 (keyed by the first). The weights held
// weakly with their versions when cast, the copy's storage held weakly with its geometry.
struct CastCopy {
  std::vector<WeakImpl> weights;
  std::vector<int64_t> versions;
  WeakStorage storage;
  std::vector<int64_t> sizes, strides;
  int64_t offset;
  at::ScalarType dtype;

  bool serves(at::TensorList of, at::ScalarType wanted) const {
    if (dtype != wanted || weights.size() != of.size()) return false;
    for (size_t i = 0; i < of.size(); ++i)
      if (versions[i] != of[i]._version() || weights[i].lock().get() != of[i].unsafeGetTensorImpl()) return false;
    return true;
  }
};

// This thread's live cache (the outermost WeightCastCache's), by the first weight's TensorImpl.
thread_local std::unordered_map<const c10::TensorImpl*, CastCopy>* active = nullptr;

// The cast of one product's use: its forward hands on the shared copy (a tensor of its own on the
// copy's storage), its backward casts the gradient back to the weights' float32 as a cast's does
// (split along dim 0 into the joined weights' rows, as a concatenation's does).
// Each forward makes its own node, numbered where the product asks for it, so the autograd engine
// runs it as soon as that product's backward has: a node shared by every micro-batch's graph
// would be numbered in the first micro-batch's forward and run last in each backward, holding
// the 16-bit gradients of all the stage's weights until then and delaying their accumulation
// (and data parallelism's reductions, which start there) to the backward's end.
class SharedCast : public torch::autograd::Function<SharedCast> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, at::TensorList weights, at::Tensor* copy) {
    ctx->saved_data["rows"] = row_counts(weights);
    ctx->saved_data["dtype"] = static_cast<int64_t>(weights[0].scalar_type());
    return *copy;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
    const std::vector<int64_t> rows = ctx->saved_data["rows"].toIntVector();
    torch::autograd::variable_list out;
    for (const at::Tensor& part : split_rows(grads[0], rows)) out.push_back(part.to(dtype));
    out.emplace_back();  // the copy's pointer
    return out;
  }
};

// A tensor of its own on `entry`'s storage, or undefined when nothing keeps that storage.
at::Tensor on_kept_storage(const CastCopy& entry, const at::Tensor& like) {
  c10::intrusive_ptr<c10::StorageImpl> kept = entry.storage.lock();
  if (!kept) return {};
  at::NoGradGuard no_grad;
  at::Tensor copy = at::empty({0}, like.options().dtype(entry.dtype));
  copy.set_(c10::Storage(std::move(kept)), entry.offset, entry.sizes, entry.strides);
  return copy;
}

}  // namespace

std::vector<int64_t> row_counts(at::TensorList parts) {
  std::vector<int64_t> rows;
  for (const at::Tensor& part : parts) rows.push_back(part.size(0));
  return rows;
}

at::Tensor join_rows(at::TensorList parts) { return parts.size() == 1 ? parts[0] : at::cat(parts, 0); }

std::vector<at::Tensor> split_rows(const at::Tensor& joined, const std::vector<int64_t>& rows) {
  return rows.size() == 1 ? std::vector<at::Tensor>{joined} : joined.split_with_sizes(rows, 0);
}

WeightCastCache::WeightCastCache() : outermost_(active == nullptr) {
  if (outermost_) active = new std::unordered_map<const c10::TensorImpl*, CastCopy>();
}

WeightCastCache::~WeightCastCache() {
  if (!outermost_) return;
  delete active;
  active = nullptr;
}

at::Tensor cast_weight(const at::Tensor& weight, at::ScalarType dtype) { return cast_joined({weight}, dtype); }

at::Tensor cast_joined(at::TensorList weights, at::ScalarType dtype) {
  const at::Tensor& first = weights[0];
  if (first.scalar_type() == dtype) return join_rows(weights);
  const bool cached = active != nullptr && std::all_of(weights.begin(), weights.end(), [](const at::Tensor& w) {
    return w.scalar_type() == at::kFloat && w.requires_grad() && w.is_leaf();
  });
  if (!cached) return join_rows(weights).to(dtype);
  const c10::TensorImpl* impl = first.unsafeGetTensorImpl();
  auto it = active->find(impl);
  at::Tensor copy;
  if (it != active->end() && it->second.serves(weights, dtype)) copy = on_kept_storage(it->second, first);
  if (!copy.defined()) {
    {
      at::NoGradGuard no_grad;
      copy = join_rows(weights).to(dtype);
    }
    CastCopy fresh{{}, {}, copy.storage().getWeakStorageImpl(), copy.sizes().vec(), copy.strides().vec(),
                   copy.storage_offset(), dtype};
    for (const at::Tensor& w : weights) {
      fresh.weights.emplace_back(w.getIntrusivePtr());
      fresh.versions.push_back(w._version());
    }
    if (it != active->end()) it->second = std::move(fresh);
    else active->emplace(impl, std::move(fresh));
  }
  if (!at::GradMode::is_enabled()) return copy;
  return SharedCast::apply(weights, &copy);
}

at::ScalarType autocast_dtype_or(c10::DeviceType device, at::ScalarType otherwise) {
  return at::autocast::is_autocast_enabled(device) ? at::autocast::get_autocast_dtype(device) : otherwise;
}

}  // namespace tessera
