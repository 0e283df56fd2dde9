// Saved-tensor hooks for a block's activations (saved_activations.h).
#include "memory/saved_activations.h"

#include <algorithm>
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
std::atomic<int64_t> live_bytes{0}, peak_bytes{0}, host_bytes{0}, host_peak_bytes{0};

void add_to(std::atomic<int64_t>& live, std::atomic<int64_t>& peak_of, int64_t bytes) {
  const int64_t now = live.fetch_add(bytes) + bytes;
  int64_t peak = peak_of.load();
  while (now > peak && !peak_of.compare_exchange_weak(peak, now)) {
  }
}

void add_live(int64_t bytes) { add_to(live_bytes, peak_bytes, bytes); }

}  // namespace

void count_saved_bytes(int64_t device, int64_t host) {
  if (device) add_to(live_bytes, peak_bytes, device);
  if (host) add_to(host_bytes, host_peak_bytes, host);
}

// One saved tensor as held between forward and backward: its encoding, or its place in the
// block's offload group. The bytes it counted leave the live total when the last node holding it
// is freed (an offloaded one's are its group's to count).
struct PackedActivation {
  EncodedTensor encoded;
  std::shared_ptr<OffloadGroup> group;
  size_t index = 0;
  int64_t counted = 0;
  ~PackedActivation() {
    if (counted) live_bytes.fetch_sub(counted);
  }
  EncodedTensor held() const { return group ? group->get(index) : encoded; }
};

// What one saved tensor's hook holds: the packed data and, where the data is its storage's
// region, the tensor's geometry in it.
struct SavedActivation {
  std::shared_ptr<PackedActivation> packed;
  bool region = false;
  std::vector<int64_t> sizes, strides;

  at::Tensor unpack() const {
    at::Tensor data = decode_activation(packed->held());
    return region ? data.as_strided(sizes, strides, data.storage_offset()) : data;
  }
};

struct SavedActivationScope::State {
  ActivationCodec codec = ActivationCodec::none;  // what pack() encodes with now
  ActivationCodec core = ActivationCodec::none;   // the attention core's (AttentionCoreSaving)
  AdaptiveCodecs* adaptive = nullptr;             // codecs by slot (adaptive_codecs.h), replacing both
  int64_t block = -1, next_slot = 0;
  bool count = false;
  std::shared_ptr<OffloadGroup> group;  // null: nothing offloaded
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

  // What pack() encodes of `t`: its region of its storage as rows (`saved` says so), or itself.
  static at::Tensor encoding_source(const at::Tensor& t, SavedActivation& saved) {
    at::Tensor source = t.detach();
    if (!region_applies(t)) return source;
    saved.region = true;
    saved.sizes = t.sizes().vec();
    saved.strides = t.strides().vec();
    const int64_t row = row_size(t);
    return source.as_strided({t.numel() / row, row}, {row, 1}, t.storage_offset());
  }

  // The encoding this scope made of the same elements of `t`'s storage at its version, if one
  // lives.
  std::shared_ptr<PackedActivation> encoding_of(const at::Tensor& t, const at::Tensor& source) const {
    const c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
    for (const Encoded& e : encoded)
      if (e.offset == source.storage_offset() && e.version == t._version() && e.sizes == source.sizes() &&
          e.strides == source.strides())
        if (auto s = e.storage.lock(); s.get() == storage)
          if (auto shared = e.packed.lock()) return shared;
    return nullptr;
  }

  // A tensor kept as it is (a weight's cast is the tensor itself, which keeps the storage a
  // pipeline step's cast cache hands to its next micro-batch: precision/autocast.h,
  // WeightCastCache), its storage counted once.
  SavedActivation keep(const at::Tensor& t, bool weight) {
    SavedActivation saved;
    saved.packed = std::make_shared<PackedActivation>();
    saved.packed->encoded = encode_activation(weight ? t : t.detach(), ActivationCodec::none);
    if (count && !weight && t.has_storage() && !counted_before(t.storage().unsafeGetStorageImpl())) {
      saved.packed->counted = static_cast<int64_t>(t.storage().nbytes());
      add_live(saved.packed->counted);
      counted_storages.emplace_back(t.storage().unsafeGetStorageImpl(), saved.packed);
    }
    return saved;
  }

  // `source` (what encoding_source gave for `t`) encoded by `with`, into the offload group where
  // there is one, remembered for the views of the same elements saved after it.
  SavedActivation encode(const at::Tensor& t, const at::Tensor& source, SavedActivation saved, ActivationCodec with) {
    saved.packed = std::make_shared<PackedActivation>();
    saved.packed->encoded = encode_activation(source, with);
    if (group) {
      const int64_t bytes = count ? saved.packed->encoded.bytes() : 0;
      if (bytes) add_live(bytes);
      saved.packed->index = group->add(std::move(saved.packed->encoded), bytes);
      saved.packed->encoded = {};
      saved.packed->group = group;
    } else if (count) {
      counted(*saved.packed);
    }
    encoded.push_back({t.storage().getWeakStorageImpl(), source.storage_offset(), t._version(), source.sizes().vec(),
                       source.strides().vec(), saved.packed});
    return saved;
  }

  // Under adaptive codecs: each new activation on the gradient's path is the block's next slot,
  // encoded as the table says; bool masks as bits; a view of elements encoded before shares them.
  SavedActivation pack_by_slot(const at::Tensor& t) {
    const bool weight = is_weight(t);
    if (weight || !t.has_storage() || !(t.requires_grad() || t.scalar_type() == at::kBool)) return keep(t, weight);
    SavedActivation saved;
    const at::Tensor source = encoding_source(t, saved);
    if ((saved.packed = encoding_of(t, source))) return saved;
    const ActivationCodec with =
        t.scalar_type() == at::kBool ? ActivationCodec::lossless : adaptive->codec_of(block, next_slot++, source, t);
    return encode(t, source, std::move(saved), with);
  }

  SavedActivation pack(const at::Tensor& t) {
    if (adaptive) return pack_by_slot(t);
    const bool weight = is_weight(t);
    // A tensor outside the gradient's path (a rotary table, a float dropout mask) is kept whole:
    // it may be a constant many nodes share. Bool masks are packed as bits by every codec.
    // Offload moves the same tensors (codec none keeps each as it is, a view of its region).
    const bool encodable = (codec != ActivationCodec::none || group) && !weight && t.has_storage() &&
                           (t.requires_grad() || t.scalar_type() == at::kBool);
    SavedActivation saved;
    // Elements this scope encoded, saved again where it would keep them as they are (the attention
    // core's output as the output projection's input, outside the core under codec none), share
    // the encoding.
    if (!encodable && !encoded.empty() && !weight && t.has_storage() && t.requires_grad()) {
      SavedActivation shared;
      const at::Tensor source = encoding_source(t, shared);
      if ((shared.packed = encoding_of(t, source))) return shared;
    }
    if (!encodable) return keep(t, weight);
    // A dense tensor with its last dimension adjacent in memory is encoded as the elements of its
    // storage it covers, in memory order as rows (row_size); any other as itself.
    const at::Tensor source = encoding_source(t, saved);
    if ((saved.packed = encoding_of(t, source))) return saved;
    return encode(t, source, std::move(saved), codec);
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

namespace {

// Every offloading block's output and group while both live: the next block's scope finds the
// group when its input is that tensor, and fetch_activations_that_made when it is named
// (saved_activations.h). Any thread may look.
using WeakTensorImpl = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;
std::mutex outputs_mutex;
std::vector<std::pair<WeakTensorImpl, std::weak_ptr<OffloadGroup>>> offloaded_outputs;

// The group of the offloading block whose forward ended with `output`; null where none lives.
std::shared_ptr<OffloadGroup> group_that_made(const at::Tensor& output) {
  if (!output.defined()) return nullptr;
  std::lock_guard<std::mutex> lock(outputs_mutex);
  for (const auto& [made, group] : offloaded_outputs)
    if (made.lock().get() == output.unsafeGetTensorImpl()) return group.lock();
  return nullptr;
}

void remember_output(const at::Tensor& output, const std::shared_ptr<OffloadGroup>& group) {
  std::lock_guard<std::mutex> lock(outputs_mutex);
  offloaded_outputs.erase(std::remove_if(offloaded_outputs.begin(), offloaded_outputs.end(),
                                         [](const auto& entry) { return entry.first.expired() || entry.second.expired(); }),
                          offloaded_outputs.end());
  offloaded_outputs.emplace_back(WeakTensorImpl(output.getIntrusivePtr()), group);
}

}  // namespace

SavedActivationScope::SavedActivationScope(ActivationCodec codec, const torch::nn::Module& module,
                                           std::shared_ptr<ActivationOffload> offload, const at::Tensor& input,
                                           std::optional<ActivationCodec> core, AdaptiveCodecs* adaptive,
                                           int64_t block) {
  if (!at::GradMode::is_enabled()) return;
  previous_ = group_that_made(input);
  const bool count = counting.load();
  const ActivationCodec core_codec = core.value_or(codec);
  if (codec == ActivationCodec::none && core_codec == ActivationCodec::none && !count && !offload && !adaptive) return;
  install_hooking_engine();
  state_ = new State();
  state_->codec = codec;
  state_->core = core_codec;
  state_->adaptive = adaptive;
  state_->block = block;
  if (adaptive && adaptive->census()) adaptive->block_starts(block, input);
  state_->count = count;
  if (offload) state_->group = std::make_shared<OffloadGroup>(std::move(offload));
  for (const auto& p : module.parameters())
    if (p.has_storage()) state_->weights.insert(p.storage().unsafeGetStorageImpl());
  scopes.push_back(state_);
}

SavedActivationScope::~SavedActivationScope() {
  if (state_ == nullptr) return;
  scopes.pop_back();
  delete state_;
}

void SavedActivationScope::ended(const at::Tensor& output) {
  if (!at::GradMode::is_enabled()) return;
  std::shared_ptr<OffloadGroup> own = state_ != nullptr ? state_->group : nullptr;
  if (own && own->empty()) own = nullptr;
  // The scope's weak references to the storages it encoded go before the store is issued: the
  // store stream may drop a storage's last reference, which must follow them.
  if (state_ != nullptr) state_->encoded.clear();
  if (own) own->store();
  // Weak: autograd keeps a graph's nodes, and so their hooks, until the whole backward ends; the
  // groups go with their last saved tensor.
  if ((own || previous_) && output.requires_grad())
    output.register_hook([own = std::weak_ptr<OffloadGroup>(own), previous = std::weak_ptr<OffloadGroup>(previous_)](
                             const at::Tensor&) {
      if (auto group = own.lock()) {
        group->backward_starts();
        group->fetch();
      }
      if (auto group = previous.lock()) group->fetch();
    });
  if (own) remember_output(output, own);
  if (state_ != nullptr && state_->adaptive && state_->adaptive->census())
    state_->adaptive->block_ends(state_->block, output);
}

AttentionCoreSaving::AttentionCoreSaving() {
  if (scopes.empty()) return;
  state_ = scopes.back();
  outside_ = state_->codec;
  state_->codec = state_->core;
}

AttentionCoreSaving::~AttentionCoreSaving() {
  if (state_ != nullptr) state_->codec = outside_;
}

void fetch_activations_that_made(const at::Tensor& output) {
  if (auto group = group_that_made(output)) group->fetch();
}

void fetch_when_gradient_reaches(const at::Tensor& input, const at::Tensor& output) {
  if (!at::GradMode::is_enabled() || !output.requires_grad()) return;
  const std::weak_ptr<OffloadGroup> group = group_that_made(input);
  if (group.expired()) return;
  output.register_hook([group](const at::Tensor&) {
    if (auto g = group.lock()) g->fetch();
  });
}

void count_saved_activations(bool on) { counting.store(on); }

SavedActivationBytes saved_activation_bytes() {
  return {live_bytes.load(), peak_bytes.load(), host_bytes.load(), host_peak_bytes.load()};
}

void reset_saved_activation_peak() {
  peak_bytes.store(live_bytes.load());
  host_peak_bytes.store(host_bytes.load());
}

}  // namespace tessera
