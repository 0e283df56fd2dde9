// memory.activation_compression = adaptive: a codec for each tensor a block saves for its backward,
// chosen from its measured sensitivity within a bit budget, as GACT (ICML'22) chooses bit widths
// at run time (docs/memory.md, "Chosen per tensor").
//
// Slots. A block's slots are the activations its SavedActivationScope encodes (memory/
// saved_activations.h: on the gradient's path, not a weight, not a bool mask, which is packed as
// bits anyway), numbered in the order its forward saves them; a tensor saved again shares its first
// encoding and is no new slot. The same forward saves the same slots each time: a block runs on the rank
// (with its tp, sp and ep groups), an MoE block's experts run stacked (the same tensors whatever the
// routing), dropout draws its masks again from the states the census recorded; config.cpp's
// check_adaptive_codecs refuses the layouts where that does not hold or the probe cannot run.
//
// The choice. Each slot is kept, int8 or int4. choose_slot_codecs minimises the summed gradient
// error the encodings cause, each slot's error modelled as its measured int4 error (the probe,
// parallel/activation_probe.h) times its codec's rounding variance against int4's (int8's step is
// 7/127 of int4's, and uniform rounding's variance goes with the square of the step; kept: 0), with
// the slots' bits (scales included; a slot the lossy codecs do not encode counts its own bits
// whatever it gets) at most `bits` times their elements. Greedy: from int4 everywhere, the
// upgrade (int4 to int8, int8 to kept) that removes the most error per bit added first, while the
// budget allows; ties go to the earlier block and slot.
//
// AdaptiveCodecs is what the scopes ask (codec_of) in one of three modes:
//   apply   the chosen table; before a choice every slot kept; a slot beyond its block's table int8
//   census  every slot int4 (the smallest codec: the census holds less than a step at any budget)
//           and recorded (elements, element size, whether a lossy codec encodes it, made by, the
//           sum of its elements), with the block's input, the random streams' states it started from (so that a
//           block run again alone draws the dropout masks it drew), its output and the gradient
//           that reaches its output
//   probe   one slot of one block int4, every other kept
// The probe runs on the thread that trains; the census's gradients may arrive on autograd's.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "memory/activation_codec.h"

namespace tessera {

struct SavedSlot {
  int64_t elements = 0;
  int64_t element_bytes = 4;
  bool lossy = false;   // lossy_encoding_applies: int8 and int4 encode it
  std::string made_by;  // the autograd node that made the tensor ("" for a leaf), for the user
  double checksum = 0;  // the sum of its elements (a tensor-parallel probe finds replicated slots by it)
};

// By block (its layer), by slot.
using BlockSlots = std::map<int64_t, std::vector<SavedSlot>>;
using SlotErrors = std::map<int64_t, std::vector<double>>;
using SlotCodecs = std::map<int64_t, std::vector<ActivationCodec>>;

// The bits one element of `slot` holds under `codec` (kept, int8 or int4), scales included.
double slot_bits_per_element(const SavedSlot& slot, ActivationCodec codec);
// The model's gradient error under `codec` relative to int4's: 1 for int4, (7/127)^2 for int8, 0 kept.
double relative_rounding_variance(ActivationCodec codec);

// The choice above; `int4_error` has an entry for every slot of `slots`.
SlotCodecs choose_slot_codecs(const BlockSlots& slots, const SlotErrors& int4_error, double bits);

struct SlotChoiceSummary {
  int64_t slots = 0, kept = 0, int8 = 0, int4 = 0;
  double bits_per_element = 0;  // of the slots' elements, under the choice
};
SlotChoiceSummary summarize_slot_codecs(const BlockSlots& slots, const SlotCodecs& codecs);

class AdaptiveCodecs {
 public:
  explicit AdaptiveCodecs(double bits) : bits_(bits) {}
  double bits() const { return bits_; }

  // The codec of slot `slot` of block `block` (memory/saved_activations.h calls it for each new
  // slot, `source` being what it encodes of the saved tensor `saved`).
  ActivationCodec codec_of(int64_t block, int64_t slot, const at::Tensor& source, const at::Tensor& saved);

  // Census: from begin_census() to end_census(), every slot int4 and recorded. block_starts keeps
  // a block's input and the random streams' states (core/random_streams.h) on its device;
  // block_ends its output and the gradient that reaches it in the census's backward.
  void begin_census();
  void block_starts(int64_t block, const at::Tensor& input);
  void block_ends(int64_t block, const at::Tensor& output);
  bool census() const { return mode_ == Mode::census; }
  // The input of the first block the census ran, with its graph (undefined outside a census).
  const at::Tensor& census_input() const { return census_input_; }
  struct BlockRecord {
    at::Tensor input, output, output_grad;
    std::vector<std::pair<std::string, at::Tensor>> random_states;
  };
  // The slots and records taken (the mode returns to apply).
  BlockSlots end_census(std::map<int64_t, BlockRecord>& records);

  // Probe: slot `slot` of block `block` int4, every other kept (slot -1: every slot kept);
  // probed_slots() counts the slots block `block` saved since.
  void probe(int64_t block, int64_t slot);
  int64_t probed_slots() const { return probed_slots_; }
  // Back to apply, with `codecs` the table.
  void apply(SlotCodecs codecs);
  const SlotCodecs& table() const { return table_; }

 private:
  enum class Mode { apply, census, probe };
  double bits_;
  Mode mode_ = Mode::apply;
  SlotCodecs table_;
  BlockSlots census_;
  at::Tensor census_input_;
  std::mutex records_mutex_;
  std::map<int64_t, BlockRecord> records_;
  int64_t probe_block_ = -1, probe_slot_ = -1, probed_slots_ = 0;
};

}  // namespace tessera
