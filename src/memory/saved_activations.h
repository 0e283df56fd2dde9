// What autograd keeps for a block's backward, encoded while it waits (Gist; docs/memory.md).
//
// While a SavedActivationScope lives on a thread, every tensor autograd saves on that thread (in
// any operation's backward node, custom functions included) goes through a pack hook: libtorch's
// saved-tensor hooks (torch/csrc/autograd/saved_variable_hooks.h), which the C++ engine asks for
// through Engine::get_default_saved_variable_hooks. The first scope replaces libtorch's default
// engine with one that answers it, through torch::autograd::set_default_engine_stub (as torch's
// Python engine replaces the C++ one). Outside a scope the new engine answers no hooks, so saving
// is what it was. A backward that ran before the first scope used libtorch's own engine, whose
// threads then stay idle.
//
// The pack hook sorts what is saved:
// - a weight: a parameter of the scope's module, a view of one (the storage is a parameter's), or
//   a cast or view of one (its autograd history reaches the parameter's accumulator through
//   single-input nodes). Kept as it is, the tensor itself: it is not an activation, and a copy
//   would outlive the residency layer's release of the parameter (a pipeline step's cast cache
//   hands the same bf16 copy to the next micro-batch while its storage lives: precision/autocast.h,
//   WeightCastCache).
// - anything else is an activation. One on the gradient's path (requires_grad) or a bool mask is
//   encoded by the scope's codec (activation_codec.h); others (a rotary table, a float dropout
//   mask) are kept whole.
// A dense tensor whose last dimension is adjacent in memory (its elements fill a region of its
// storage, the outer dimensions in any order) is encoded as that region, in memory order, in the
// groups of its last dimension, and decoded back into its own sizes and strides: two views of the
// same elements (the CPU attention's output [B, H, T, d] and the projection's input [B T, C]
// reshaped from it) share one encoding, as they shared one storage. Any other tensor is encoded as
// a contiguous copy, shared by the nodes that save the same view at the same version. Either
// way each element is encoded in the group of its last dimension it would have in a contiguous
// copy, so the encoding of a value does not depend on how the tensor holding it was laid out.
// The unpack hook decodes it when the backward node runs (each time: the split backward of the
// zero-bubble schedules unpacks a W's inputs after its I did).
//
// Offload (memory.activation_offload): a scope given an ActivationOffload puts every activation
// it keeps (encoded, or as it is under codec none, but never a weight or a tensor off the
// gradient's path) into one OffloadGroup (activation_offload.h), stored to the host by ended()
// and fetched back by a hook on the block's output. A scope also remembers the group of the block
// that made its input (found by the tensor: every offloading block's output is remembered while
// it and its group live): ended() hooks the output to fetch that group too, whether or not this block offloads,
// so a block's copies come back during the backward of the block after it (the last block's
// during the head's: fetch_when_gradient_reaches; a pipeline stage's last block's when the
// receive of its output gradient is posted: fetch_activations_that_made).
//
// Counting: with counting on (bench), every scope also counts the bytes its activations hold
// (encoded size where encoded, each storage once when kept) from pack to the release of the last
// node holding them; saved_activation_bytes() reads the live total and its peak, on the device
// and, for offloaded groups, on the host.
//
// The attention core (memory.attention_compression): a scope may be given a second codec for what
// autograd saves inside the attention's core (its q, k and v, the kernel's own tensors and output,
// from the split of the input projection's output to the core's result: the softmax kind's
// CausalSelfAttention::core, the linear kind's LinearAttention::core), which the model marks by an
// AttentionCoreSaving while the core runs. GACT's observation holds for tessera's blocks (measured,
// docs/memory.md): those tensors move the gradients most when rounded, the core's softmax
// amplifying an error in q or k, so they may keep more bits than the rest of the block. A tensor
// saved inside the core and again after it (the fused core's output, the output projection's
// input) keeps the core's encoding, which the projection shares.
//
// Chosen per tensor (memory.activation_compression = adaptive): a scope given an AdaptiveCodecs
// (adaptive_codecs.h) and its block's number encodes each activation with the codec that table
// gives its slot (the k-th new activation on the gradient's path the scope encodes), bool masks as
// bits; in the census it records each slot, the block's input and the gradient reaching its output.
//
// Invariants: scopes nest per thread (the innermost governs); a scope never packs while this
// thread recomputes a checkpointed segment (memory/activation_checkpointing.h): those tensors are
// used at once. Encoding runs under no-grad on the saved tensor's device.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include <torch/nn/module.h>

#include "memory/activation_codec.h"
#include "memory/activation_offload.h"
#include "memory/adaptive_codecs.h"

namespace tessera {

class SavedActivationScope {
 public:
  // Saves nothing differently when both codecs are none, offload and adaptive are null and
  // counting is off, or grad mode is off. `input`: the block's input (to find the group of the
  // block that made it); `core`: the attention core's codec (unset: `codec`); `adaptive`: the
  // codecs chosen per slot, which replace both, `block` naming this block's slots.
  SavedActivationScope(ActivationCodec codec, const torch::nn::Module& module,
                       std::shared_ptr<ActivationOffload> offload = nullptr, const at::Tensor& input = {},
                       std::optional<ActivationCodec> core = std::nullopt, AdaptiveCodecs* adaptive = nullptr,
                       int64_t block = -1);
  ~SavedActivationScope();
  // The block's forward ended with `output`: its offloaded activations leave for the host, and
  // the gradient reaching `output` fetches them and the previous block's.
  void ended(const at::Tensor& output);
  SavedActivationScope(const SavedActivationScope&) = delete;
  SavedActivationScope& operator=(const SavedActivationScope&) = delete;

  struct State;

 private:
  State* state_ = nullptr;
  std::shared_ptr<OffloadGroup> previous_;  // the group of the block that made the input
};

// While one lives, what autograd saves on this thread is encoded with the innermost scope's core
// codec (above); nothing outside a scope. The attention kinds make one around their core.
class AttentionCoreSaving {
 public:
  AttentionCoreSaving();
  ~AttentionCoreSaving();
  AttentionCoreSaving(const AttentionCoreSaving&) = delete;
  AttentionCoreSaving& operator=(const AttentionCoreSaving&) = delete;

 private:
  SavedActivationScope::State* state_ = nullptr;
  ActivationCodec outside_ = ActivationCodec::none;
};

// The group of the block that made `input` (when it offloads) is fetched when the gradient reaches
// `output`: the model's head gives the last block's fetch the head's backward as lead.
void fetch_when_gradient_reaches(const at::Tensor& input, const at::Tensor& output);

// The offload group of the block whose forward ended with `output` (when it offloads) is fetched
// now, ahead of that block's backward: a pipeline stage's last block, whose output gradient comes
// from the next stage, when its receive is posted (parallel/pipeline_step.h). Nothing when no
// such group lives.
void fetch_activations_that_made(const at::Tensor& output);

// Whether scopes count the bytes they save (off by default; the bench turns it on).
void count_saved_activations(bool on);

struct SavedActivationBytes {
  int64_t live = 0;  // held now on the device by backward nodes not yet run or freed
  int64_t peak = 0;  // the most held at once on the device since the last reset
  int64_t host = 0;       // offloaded, held now in host memory
  int64_t host_peak = 0;  // the most held at once in host memory since the last reset
};
SavedActivationBytes saved_activation_bytes();
void reset_saved_activation_peak();
// Moves the counts by these bytes (the scopes and activation_offload.h; only while counting).
void count_saved_bytes(int64_t device, int64_t host);

}  // namespace tessera
