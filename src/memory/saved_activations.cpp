// Saved-tensor hooks for a block's activations (saved_activations.h).
#include "memory/saved_activations.h"

#include <atomic>
#include <memory>
#include <mutex>
#include <unordered_set>
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

// What one saved tensor's hook holds: the packed data and, where the data is its storage's
// region, the tensor's geometry in it.
struct SavedActivation {
  std::shared_ptr<PackedActivation> packed;
  bool region = false;
  std::vector<int64_t> sizes, strides;

  at::Tensor unpack() const {
    at::Tensor data = decode_activation(packed->encoded);
    return region ? data.as_strided(sizes, strides, data.storage_offset()) : data;
  }
};

struct SavedActivationScope::State {
  ActivationCodec codec = ActivationCodec::none;
  bool count = false;
  std::unordered_set<const c10::StorageImpl*> weights;  // the module's parameters' storages
  // The encodings made in this scope, by the place in its storage of the tensor encoded (a dense
  // tensor's rows or the tensor itself) and its version: two views of the same elements (an
  // attention's output and the projection's input reshaped from it), or one tensor saved by
  // several nodes, share one. And the storages kept tensors count.
  struct Encoded {
    c10::weak_intrusive_ptr<c10::StorageImpl> storage;
    int64_t offset, version;
    std::vector<int64_t> sizes, strides;
    std::weak_ptr<PackedActivation> packed;
  };
  std::vector<Encoded> encoded;
  std::vector<std::pair<const c10::StorageImpl*, std::weak_ptr<PackedActivation>>> counted_storages;

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

  // Whether `t` is encoded as its storage's region: dense, its last dimension the one adjacent in
  // memory. Its rows are then the encoding's groups of that last dimension (activation_codec.h),
  // in memory order, so every element is encoded exactly as a contiguous copy would be; views of
  // the same elements whose last dimensions are both multiples of the group share the encoding.
  static bool region_applies(const at::Tensor& t) {
    return t.dim() >= 1 && t.size(-1) > 1 && t.stride(-1) == 1 && t.is_non_overlapping_and_dense();
  }
  static int64_t row_size(const at::Tensor& t) {
    return t.size(-1) % kActivationGroup == 0 ? kActivationGroup : t.size(-1);
  }

  SavedActivation pack(const at::Tensor& t) {
    const bool weight = is_weight(t);
    // A tensor outside the gradient's path (a rotary table, a float dropout mask) is kept whole:
    // it may be a constant many nodes share. Bool masks are packed as bits by every codec.
    const bool encodable = codec != ActivationCodec::none && !weight && t.has_storage() &&
                           (t.requires_grad() || t.scalar_type() == at::kBool);
    SavedActivation saved;
    if (!encodable) {
      saved.packed = std::make_shared<PackedActivation>();
      saved.packed->encoded = encode_activation(t.detach(), ActivationCodec::none);
      if (count && !weight && t.has_storage() && !counted_before(t.storage().unsafeGetStorageImpl())) {
        saved.packed->counted = static_cast<int64_t>(t.storage().nbytes());
        add_live(saved.packed->counted);
        counted_storages.emplace_back(t.storage().unsafeGetStorageImpl(), saved.packed);
      }
      return saved;
    }
    // A dense tensor with its last dimension adjacent in memory is encoded as the elements of its
    // storage it covers, in memory order as rows (row_size); any other as itself.
    at::Tensor source = t.detach();
    if (region_applies(t)) {
      saved.region = true;
      saved.sizes = t.sizes().vec();
      saved.strides = t.strides().vec();
      const int64_t row = row_size(t);
      source = source.as_strided({t.numel() / row, row}, {row, 1}, t.storage_offset());
    }
    const c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
    for (const Encoded& e : encoded)
      if (e.offset == source.storage_offset() && e.version == t._version() && e.sizes == source.sizes() &&
          e.strides == source.strides())
        if (auto s = e.storage.lock(); s.get() == storage)
          if (auto shared = e.packed.lock()) {
            saved.packed = shared;
            return saved;
          }
    saved.packed = std::make_shared<PackedActivation>();
    saved.packed->encoded = encode_activation(source, codec);
    if (count) counted(*saved.packed);
    encoded.push_back({t.storage().getWeakStorageImpl(), source.storage_offset(), t._version(), source.sizes().vec(),
                       source.strides().vec(), saved.packed});
    return saved;
  }

  void counted(PackedActivation& packed) {
    packed.counted = packed.encoded.bytes();
    add_live(packed.counted);
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
    saved_ = scope_->pack(tensor);
    scope_ = nullptr;  // the scope ends before the backward: only the packed tensor is kept
  }
  at::Tensor call_unpack_hook() override { return saved_.unpack(); }

 private:
  SavedActivationScope::State* scope_;
  SavedActivation saved_;
};

// The engine every backward runs on once a scope was made: libtorch's, answering the default
// saved-tensor hooks from this thread's innermost scope.
struct HookingEngine : torch::autograd::Engine {
  std::unique_ptr<torch::autograd::SavedVariableHooks> get_default_saved_variable_hooks() override {
    if (scopes.empty() || recomputing()) return nullptr;
    return std::make_unique<PackHooks>(scopes.back());
  }
};

torch::autograd::Engine& hooking_engine() {
  // Never destroyed (so no stop() before the base destructor): a backward may run during static
  // destruction.
  static auto* engine = new HookingEngine();
  return *engine;
}

// Makes the hooking engine libtorch's default: Engine::get_default_engine() returns what the
// function given to torch::autograd::set_default_engine_stub returns (torch's Python engine
// installs itself the same way).
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
