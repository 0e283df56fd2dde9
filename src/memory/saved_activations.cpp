// Saved-tensor hooks for a block's activations (saved_activations.h).
#include "memory/saved_activations.h"

#include <atomic>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include <ATen/core/grad_mode.h>
#include <c10/core/StorageImpl.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/saved_variable_hooks.h>

#include "memory/activation_checkpointing.h"

namespace tessera {
namespace {

std::atomic<bool> counting{false};
std::atomic<int64_t> live_bytes{0}, peak_bytes{0};

void add_live(int64_t bytes) {
  const int64_t now = live_bytes.fetch_add(bytes) + bytes;
  int64_t peak = peak_bytes.load();
  while (now > peak && !peak_bytes.compare_exchange_weak(peak, now)) {
  }
}

}  // namespace

// One saved tensor as held between forward and backward; the bytes it counted leave the live
// total when the last node holding it is freed.
struct PackedActivation {
  EncodedTensor encoded;
  int64_t counted = 0;
  ~PackedActivation() {
    if (counted) live_bytes.fetch_sub(counted);
  }
};
using Packed = PackedActivation;

struct SavedActivationScope::State {
  ActivationCodec codec = ActivationCodec::none;
  bool count = false;
  std::unordered_set<const c10::StorageImpl*> weights;  // the module's parameters' storages
  // Tensors packed in this scope (to share one encoding), and the storages kept whole ones count.
  struct Seen {
    c10::weak_intrusive_ptr<c10::TensorImpl> impl;
    int64_t version;
    std::weak_ptr<Packed> packed;
  };
  std::vector<Seen> seen;
  std::vector<std::pair<const c10::StorageImpl*, std::weak_ptr<Packed>>> counted_storages;

  bool is_weight_storage(const at::Tensor& t) const {
    return t.has_storage() && weights.count(t.storage().unsafeGetStorageImpl()) > 0;
  }

  // A parameter, a view of one, or a cast or view of one (saved_activations.h).
  bool is_weight(const at::Tensor& t) const {
    if (is_weight_storage(t)) return true;
    const torch::autograd::Node* fn = t.grad_fn().get();
    for (int hop = 0; fn != nullptr && hop < 4; ++hop) {
      if (const auto* acc = dynamic_cast<const torch::autograd::AccumulateGrad*>(fn)) return is_weight_storage(acc->variable);
      const torch::autograd::Node* next = nullptr;
      for (const auto& edge : fn->next_edges()) {
        if (!edge.function) continue;
        if (next != nullptr) return false;
        next = edge.function.get();
      }
      fn = next;
    }
    return false;
  }

  std::shared_ptr<Packed> pack(const at::Tensor& t) {
    for (const Seen& s : seen)
      if (s.version == t._version())
        if (auto impl = s.impl.lock(); impl.get() == t.unsafeGetTensorImpl())
          if (auto shared = s.packed.lock()) return shared;
    auto packed = std::make_shared<Packed>();
    const bool weight = is_weight(t);
    // A tensor outside the gradient's path (a rotary table, a float dropout mask) is kept whole:
    // it may be a constant many nodes share. Bool masks are packed as bits by every codec.
    const bool encodable = !weight && (t.requires_grad() || t.scalar_type() == at::kBool);
    packed->encoded = encode_activation(t.detach(), encodable ? codec : ActivationCodec::none);
    if (count && !weight) {
      if (packed->encoded.form != EncodedTensor::Form::kept) packed->counted = packed->encoded.bytes();
      else if (t.has_storage() && !counted_before(t.storage().unsafeGetStorageImpl())) {
        packed->counted = static_cast<int64_t>(t.storage().nbytes());
        counted_storages.emplace_back(t.storage().unsafeGetStorageImpl(), packed);
      }
      add_live(packed->counted);
    }
    seen.push_back({c10::weak_intrusive_ptr<c10::TensorImpl>(t.getIntrusivePtr()), t._version(), packed});
    return packed;
  }

  bool counted_before(const c10::StorageImpl* storage) const {
    for (const auto& [s, holder] : counted_storages)
      if (s == storage && !holder.expired()) return true;
    return false;
  }
};

namespace {

thread_local std::vector<SavedActivationScope::State*> scopes;

class PackHooks : public torch::autograd::SavedVariableHooks {
 public:
  explicit PackHooks(SavedActivationScope::State* scope) : scope_(scope) {}
  void call_pack_hook(const at::Tensor& tensor) override {
    packed_ = scope_->pack(tensor);
    scope_ = nullptr;  // the scope ends before the backward: only the packed tensor is kept
  }
  at::Tensor call_unpack_hook() override { return decode_activation(packed_->encoded); }

 private:
  SavedActivationScope::State* scope_;
  std::shared_ptr<Packed> packed_;
};

// The engine every backward runs on once a scope was made: libtorch's, answering the default
// saved-tensor hooks from this thread's innermost scope.
struct HookingEngine : torch::autograd::Engine {
  ~HookingEngine() override { stop(); }
  std::unique_ptr<torch::autograd::SavedVariableHooks> get_default_saved_variable_hooks() override {
    if (scopes.empty() || recomputing()) return nullptr;
    return std::make_unique<PackHooks>(scopes.back());
  }
};

torch::autograd::Engine& hooking_engine() {
  static auto* engine = new HookingEngine();  // never destroyed: backward may run during static destruction
  return *engine;
}

void install_hooking_engine() {
  static std::once_flag once;
  std::call_once(once, [] { torch::autograd::set_default_engine_stub(&hooking_engine); });
}

}  // namespace

SavedActivationScope::SavedActivationScope(ActivationCodec codec, const torch::nn::Module& module) {
  const bool count = counting.load();
  if ((codec == ActivationCodec::none && !count) || !at::GradMode::is_enabled()) return;
  install_hooking_engine();
  state_ = new State();
  state_->codec = codec;
  state_->count = count;
  for (const auto& p : module.parameters())
    if (p.has_storage()) state_->weights.insert(p.storage().unsafeGetStorageImpl());
  scopes.push_back(state_);
}

SavedActivationScope::~SavedActivationScope() {
  if (state_ == nullptr) return;
  scopes.pop_back();
  delete state_;
}

void count_saved_activations(bool on) { counting.store(on); }

SavedActivationBytes saved_activation_bytes() { return {live_bytes.load(), peak_bytes.load()}; }

void reset_saved_activation_peak() { peak_bytes.store(live_bytes.load()); }

}  // namespace tessera
