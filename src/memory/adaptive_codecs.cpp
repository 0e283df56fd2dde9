// Codecs chosen per saved tensor (adaptive_codecs.h).
#include "memory/adaptive_codecs.h"

#include <algorithm>
#include <queue>
#include <tuple>

#include <torch/csrc/autograd/function.h>

#include "core/error.h"
#include "core/random_streams.h"

namespace tessera {

double slot_bits_per_element(const SavedSlot& slot, ActivationCodec codec) {
  if (!slot.lossy || codec == ActivationCodec::none) return 8.0 * static_cast<double>(slot.element_bytes);
  return 8.0 * activation_codec_bytes_per_element(codec, slot.element_bytes);
}

double relative_rounding_variance(ActivationCodec codec) {
  if (codec == ActivationCodec::int4) return 1.0;
  if (codec == ActivationCodec::int8) return (7.0 / 127.0) * (7.0 / 127.0);
  require(codec == ActivationCodec::none, "internal: an adaptive slot is kept, int8 or int4 (got ",
          activation_codec_name(codec), ")");
  return 0.0;
}

SlotCodecs choose_slot_codecs(const BlockSlots& slots, const SlotErrors& int4_error, double bits) {
  SlotCodecs codecs;
  double budget = 0, used = 0;
  for (const auto& [block, list] : slots) {
    codecs[block].assign(list.size(), ActivationCodec::int4);
    for (const SavedSlot& s : list) {
      budget += bits * static_cast<double>(s.elements);
      used += slot_bits_per_element(s, ActivationCodec::int4) * static_cast<double>(s.elements);
    }
  }
  // An upgrade of one slot: error removed per bit added, then the block and slot (earlier first),
  // and the codec it leaves.
  using Upgrade = std::tuple<double, int64_t, int64_t, ActivationCodec>;
  auto later = [](const Upgrade& a, const Upgrade& b) {
    if (std::get<0>(a) != std::get<0>(b)) return std::get<0>(a) < std::get<0>(b);
    if (std::get<1>(a) != std::get<1>(b)) return std::get<1>(a) > std::get<1>(b);
    return std::get<2>(a) > std::get<2>(b);
  };
  std::priority_queue<Upgrade, std::vector<Upgrade>, decltype(later)> upgrades(later);
  auto added_bits = [&](const SavedSlot& s, ActivationCodec from) {
    const ActivationCodec to = from == ActivationCodec::int4 ? ActivationCodec::int8 : ActivationCodec::none;
    return (slot_bits_per_element(s, to) - slot_bits_per_element(s, from)) * static_cast<double>(s.elements);
  };
  auto offer = [&](int64_t block, int64_t slot, ActivationCodec from) {
    const SavedSlot& s = slots.at(block)[static_cast<size_t>(slot)];
    const ActivationCodec to = from == ActivationCodec::int4 ? ActivationCodec::int8 : ActivationCodec::none;
    const double added = added_bits(s, from);
    if (added <= 0) return;  // a slot no lossy codec encodes: its bits are the same whatever it gets
    const double error = int4_error.at(block).at(static_cast<size_t>(slot));
    upgrades.emplace((relative_rounding_variance(from) - relative_rounding_variance(to)) * error / added, block, slot,
                     from);
  };
  for (const auto& [block, list] : slots)
    for (size_t k = 0; k < list.size(); ++k) offer(block, static_cast<int64_t>(k), ActivationCodec::int4);
  while (!upgrades.empty()) {
    const auto [gain, block, slot, from] = upgrades.top();
    upgrades.pop();
    const SavedSlot& s = slots.at(block)[static_cast<size_t>(slot)];
    const double added = added_bits(s, from);
    if (used + added > budget) continue;
    used += added;
    ActivationCodec& codec = codecs[block][static_cast<size_t>(slot)];
    codec = from == ActivationCodec::int4 ? ActivationCodec::int8 : ActivationCodec::none;
    if (codec == ActivationCodec::int8) offer(block, slot, ActivationCodec::int8);
  }
  return codecs;
}

SlotChoiceSummary summarize_slot_codecs(const BlockSlots& slots, const SlotCodecs& codecs) {
  SlotChoiceSummary out;
  double bits = 0, elements = 0;
  for (const auto& [block, list] : slots)
    for (size_t k = 0; k < list.size(); ++k) {
      const ActivationCodec codec = codecs.at(block).at(k);
      ++out.slots;
      (codec == ActivationCodec::none ? out.kept : codec == ActivationCodec::int8 ? out.int8 : out.int4) += 1;
      bits += slot_bits_per_element(list[k], codec) * static_cast<double>(list[k].elements);
      elements += static_cast<double>(list[k].elements);
    }
  out.bits_per_element = elements > 0 ? bits / elements : 0;
  return out;
}

ActivationCodec AdaptiveCodecs::codec_of(int64_t block, int64_t slot, const at::Tensor& source,
                                         const at::Tensor& saved) {
  switch (mode_) {
    case Mode::census: {
      std::vector<SavedSlot>& list = census_[block];
      require(static_cast<int64_t>(list.size()) == slot, "internal: block ", block, "'s slot ", slot,
              " saved out of order in the census");
      list.push_back({source.numel(), static_cast<int64_t>(source.element_size()), lossy_encoding_applies(source),
                      saved.grad_fn() ? saved.grad_fn()->name() : "", source.sum(at::kDouble).item<double>()});
      return ActivationCodec::int4;
    }
    case Mode::probe:
      if (block == probe_block_) probed_slots_ = std::max(probed_slots_, slot + 1);
      return block == probe_block_ && slot == probe_slot_ ? ActivationCodec::int4 : ActivationCodec::none;
    case Mode::apply: break;
  }
  const auto it = table_.find(block);
  if (it == table_.end()) return table_.empty() ? ActivationCodec::none : ActivationCodec::int8;
  return slot < static_cast<int64_t>(it->second.size()) ? it->second[static_cast<size_t>(slot)] : ActivationCodec::int8;
}

void AdaptiveCodecs::begin_census() {
  mode_ = Mode::census;
  census_.clear();
  census_input_ = at::Tensor();
  std::lock_guard<std::mutex> lock(records_mutex_);
  records_.clear();
}

void AdaptiveCodecs::block_starts(int64_t block, const at::Tensor& input) {
  if (!census_input_.defined()) census_input_ = input;
  auto states = random::states(input.is_cuda() ? std::optional<c10::Device>(input.device()) : std::nullopt);
  std::lock_guard<std::mutex> lock(records_mutex_);
  BlockRecord& record = records_[block];
  record.input = input.detach();
  record.random_states = std::move(states);
}

void AdaptiveCodecs::block_ends(int64_t block, const at::Tensor& output) {
  {
    std::lock_guard<std::mutex> lock(records_mutex_);
    records_[block].output = output.detach();
  }
  census_[block];  // a block that saves no slot still has its (empty) list
  if (!output.requires_grad()) return;
  output.register_hook([this, block](const at::Tensor& grad) {
    std::lock_guard<std::mutex> lock(records_mutex_);
    records_[block].output_grad = grad.detach();
  });
}

BlockSlots AdaptiveCodecs::end_census(std::map<int64_t, BlockRecord>& records) {
  mode_ = Mode::apply;
  census_input_ = at::Tensor();
  {
    std::lock_guard<std::mutex> lock(records_mutex_);
    records = std::move(records_);
    records_.clear();
  }
  BlockSlots out = std::move(census_);
  census_.clear();
  return out;
}

void AdaptiveCodecs::probe(int64_t block, int64_t slot) {
  mode_ = Mode::probe;
  probe_block_ = block;
  probe_slot_ = slot;
  probed_slots_ = 0;
}

void AdaptiveCodecs::apply(SlotCodecs codecs) {
  mode_ = Mode::apply;
  table_ = std::move(codecs);
}

}  // namespace tessera
