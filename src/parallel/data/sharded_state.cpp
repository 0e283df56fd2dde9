// DataParallel's optimizer state as whole tensors, whatever N and the stage (data_parallel.h), and
// the gradient compressor's state.
//
// At stages 1-3 each rank's optimizer holds one slice per parameter part it owns; the whole
// tensor of an elementwise slot is all-gathered unit by unit in the flat layout (flat_unit.h) and
// cut back into parameter shapes, and loading takes each rank's slices of the whole tensors. A
// sharded checkpoint needs no gathering: each rank writes the slices it owns (at stage 0 an even
// slice of each tensor over its parameter's reduction group). "Whole" is over the reduction
// groups: under expert parallelism an expert's state is this rank's experts' (the caller joins
// the ep parts, parallel/parameter_placement.h).
#include <set>

#include <ATen/ATen.h>

#include "core/error.h"
#include "optim/optimizer.h"
#include "parallel/data/data_parallel_impl.h"

namespace tessera {
namespace {

// The optimizer's elementwise slots (Impl::state_slots: AdamW's exp_avg and exp_avg_sq, SGD's
// momentum_buffer) are sharded like the parameters; the scalar step is not. (Sharded stages run
// elementwise optimizers only: Adafactor's factored state spans whole rows and columns.)
const std::string kStepSlot = "step";

}  // namespace

NamedParams DataParallel::full_optimizer_state() {
  Impl& s = *impl_;
  if (s.stage == 0) return s.optimizer->state();
  std::map<std::string, at::Tensor> mine;
  for (auto& [name, t] : s.optimizer->state()) mine[name] = t;
  std::map<std::string, at::Tensor> whole;
  // Elementwise slots: each unit's shards gathered. Steps: the max over ranks (those owning none
  // of a parameter report 0; the owners agree).
  at::Tensor steps = at::zeros({static_cast<int64_t>(s.params.size())}, at::kFloat);
  std::map<std::string, int64_t> position;
  for (size_t i = 0; i < s.params.size(); ++i) position[s.params[i].first] = static_cast<int64_t>(i);
  for (const auto& unit : s.units) {
    for (const auto& slot : s.state_slots.slots) {
      auto tensors = unit.gather_entries(
          [&](const FlatUnit::Entry& e) {
            auto it = mine.find(e.name + "." + slot);
            return it == mine.end() ? at::Tensor() : it->second;
          },
          unit.flat().options());
      for (size_t j = 0; j < tensors.size(); ++j) whole[unit.entries()[j].name + "." + slot] = tensors[j];
    }
    for (const auto& e : unit.entries()) {
      auto it = mine.find(e.name + "." + kStepSlot);
      if (it != mine.end()) steps[position.at(e.name)] = it->second.item<float>();
    }
  }
  const at::Device device = s.params.front().second.device();
  at::Tensor all_steps = steps.to(device);
  s.dp.all_reduce(all_steps, comm::ReduceOp::max);
  NamedParams out;
  for (size_t i = 0; i < s.params.size(); ++i) {
    const std::string& name = s.params[i].first;
    for (const auto& slot : s.state_slots.slots) out.emplace_back(name + "." + slot, whole.at(name + "." + slot));
    if (s.state_slots.step) out.emplace_back(name + "." + kStepSlot, all_steps[static_cast<int64_t>(i)].clone());
  }
  return out;
}

std::vector<std::pair<std::string, OptimizerRange>> DataParallel::Impl::owned_ranges() const {
  std::map<std::string, OptimizerRange> by_name;
  for (const auto& unit : units)
    for (const auto& e : unit.entries()) {
      const auto [begin, end] = unit.owned(e);
      by_name[e.name] = {e.param.sizes().vec(), begin == end ? 0 : begin - e.offset, begin == end ? 0 : end - e.offset};
    }
  std::vector<std::pair<std::string, OptimizerRange>> out;
  for (const auto& [name, p] : params) out.emplace_back(name, by_name.at(name));
  return out;
}

OptimizerRanges DataParallel::optimizer_state_ranges() const {
  const Impl& s = *impl_;
  OptimizerRanges out;
  if (s.stage == 0) return out;
  for (const auto& [name, range] : s.owned_ranges())
    for (const auto& slot : s.state_slots.slots) out[name + "." + slot] = range;
  return out;
}

std::vector<TensorSlice> DataParallel::optimizer_state_slices() const {
  const Impl& s = *impl_;
  if (s.stage == 0) {
    // Each tensor in even slices over the replicas holding it: its parameter's reduction group.
    std::map<std::string, size_t> group_of;
    for (size_t i = 0; i < s.params.size(); ++i) group_of[s.params[i].first] = s.group_of[i];
    std::vector<TensorSlice> out;
    for (auto& [name, t] : s.optimizer->state()) {
      const auto param = group_of.find(parameter_of_state(name));
      const comm::Group& g = s.group(param == group_of.end() ? 0 : param->second);
      for (TensorSlice& slice : even_slices({{name, t}}, g.rank(), g.size())) out.push_back(std::move(slice));
    }
    return out;
  }
  std::map<std::string, at::Tensor> mine;
  for (const auto& [name, t] : s.optimizer->state()) mine[name] = t;
  std::vector<TensorSlice> out;
  for (const auto& [name, owned] : s.owned_ranges()) {
    if (owned.begin == owned.end) continue;
    for (const auto& slot : s.state_slots.slots)
      out.push_back({name + "." + slot, mine.at(name + "." + slot), owned});
    // The step once, from the owner of the first element, as full_optimizer_state() gives it:
    // a float32 scalar.
    if (s.state_slots.step && owned.begin == 0)
      out.push_back({name + "." + kStepSlot, mine.at(name + "." + kStepSlot).to(at::kFloat).reshape({}), Region::whole({})});
  }
  return out;
}

void DataParallel::load_full_optimizer_state(const std::map<std::string, at::Tensor>& state,
                                             const std::string& source) {
  Impl& s = *impl_;
  if (s.stage == 0) return s.optimizer->load_state(state, source);
  std::map<std::string, at::Tensor> ranged = state;
  for (const auto& [name, range] : optimizer_state_ranges()) {
    auto it = ranged.find(name);
    if (it == ranged.end()) continue;  // named as missing below
    require(it->second.sizes().vec() == range.shape, source, ": optimizer state ", name, " has shape ",
            it->second.sizes(), ", expected ", at::IntArrayRef(range.shape));
    it->second = it->second.reshape(-1).narrow(0, range.begin, range.end - range.begin);
  }
  load_optimizer_state_ranges(ranged, source);
}

void DataParallel::load_optimizer_state_ranges(const std::map<std::string, at::Tensor>& state,
                                               const std::string& source) {
  Impl& s = *impl_;
  require(s.stage > 0, "internal: load_optimizer_state_ranges at ZeRO stage 0");
  const OptimizerRanges ranges = optimizer_state_ranges();
  std::set<std::string> expected;
  for (const auto& [name, range] : ranges) {
    auto it = state.find(name);
    require(it != state.end(), source, ": optimizer state ", name, " is missing");
    require(it->second.numel() == range.end - range.begin, source, ": optimizer state ", name, " holds ",
            it->second.numel(), " elements for this rank's ", range.end - range.begin);
    expected.insert(name);
  }
  for (const auto& [name, p] : s.params) {
    if (!s.state_slots.step) break;
    auto it = state.find(name + "." + kStepSlot);
    require(it != state.end() && it->second.numel() == 1, source, ": optimizer state ", name, ".", kStepSlot,
            " is missing or not a scalar");
    expected.insert(name + "." + kStepSlot);
  }
  for (const auto& entry : state)
    require(expected.count(entry.first) > 0, source, ": unexpected optimizer state ", entry.first,
            " (no such parameter slot)");
  std::map<std::string, at::Tensor> mine;
  for (const auto& [name, owned] : s.owned_ranges()) {
    if (owned.begin == owned.end) continue;
    for (const auto& slot : s.state_slots.slots) mine[name + "." + slot] = state.at(name + "." + slot).reshape(-1);
    if (s.state_slots.step) mine[name + "." + kStepSlot] = state.at(name + "." + kStepSlot).reshape({});
  }
  s.optimizer->load_state(mine, source);
}

NamedParams DataParallel::compression_state() const {
  return impl_->compressor ? impl_->compressor->state() : NamedParams{};
}

void DataParallel::load_compression_state(const std::map<std::string, at::Tensor>& state, const std::string& source) {
  if (impl_->compressor) return impl_->compressor->load_state(state, source);
  require(state.empty(), source, ": gradient-compression state ", state.empty() ? "" : state.begin()->first,
          " given, but parallel.grad_compression = none");
}

NamedTensors DataParallel::gradients() {
  Impl& s = *impl_;
  at::NoGradGuard no_grad;
  NamedTensors out;
  if (s.stage <= 1) {
    for (const auto& [name, p] : s.params) out.emplace_back(name, p.grad().defined() ? p.grad().clone() : at::Tensor());
    return out;
  }
  std::map<std::string, at::Tensor> whole;
  for (size_t u = 0; u < s.units.size(); ++u) {
    const FlatUnit& unit = s.units[u];
    const std::vector<at::Tensor> tensors = unit.gather_entries(
        [&](const FlatUnit::Entry& e) {
          const auto [begin, end] = unit.owned(e);
          return begin == end ? at::Tensor() : unit.owned_part(e, s.grad_shards[u]);
        },
        s.grad_shards[u].options());
    for (size_t j = 0; j < tensors.size(); ++j) whole[unit.entries()[j].name] = tensors[j];
  }
  for (const auto& [name, p] : s.params) out.emplace_back(name, whole.at(name));
  return out;
}

// OptimizerOwner's state: the optimizer's under "optim.".
NamedTensors DataParallel::training_state() {
  NamedTensors out;
  for (auto& [name, t] : full_optimizer_state()) out.emplace_back("optim." + name, t);
  return out;
}

// Only the "optim." entries are the owner's (a checkpoint's state also holds the RNG's).
void DataParallel::load_training_state(const std::map<std::string, at::Tensor>& tensors, const std::string& source) {
  load_full_optimizer_state(with_prefix(tensors, "optim."), source);
}

StateKind DataParallel::state_kind(const std::string& name) const {
  return owned_state_kind(*impl_->optimizer, name);
}

OptimizerRanges DataParallel::training_state_ranges() const {
  OptimizerRanges out;
  for (const auto& [name, range] : optimizer_state_ranges()) out.emplace("optim." + name, range);
  return out;
}

void DataParallel::load_training_state_ranges(const std::map<std::string, at::Tensor>& tensors,
                                              const std::string& source) {
  load_optimizer_state_ranges(with_prefix(tensors, "optim."), source);
}

std::optional<std::vector<TensorSlice>> DataParallel::own_training_state_slices() const {
  std::vector<TensorSlice> out = optimizer_state_slices();
  for (TensorSlice& slice : out) slice.name = "optim." + slice.name;
  return out;
}

}  // namespace tessera
