// A parallel model's state in a form independent of the layout: whole tensors under the model's
// own names, or this rank's slices of them, for checkpoints that load at any layout (parallelize.h).
#include "parallel/parallelize.h"

#include <algorithm>
#include <set>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include "core/error.h"
#include "model/hf_names.h"

namespace tessera {

NamedTensors ParallelModel::routing_state() const { return model_->routing_state(); }

void ParallelModel::load_routing_state(const std::map<std::string, at::Tensor>& tensors) {
  model_->load_routing_state(tensors);
}

NamedTensors ParallelModel::model_state() {
  // This stage's parameters whole (ZeRO-3 gathers them unit by unit), then over the stages.
  auto params = model_->named_parameters();
  std::map<std::string, at::Tensor> mine;
  NamedTensors out;
  owner_->visit_full_parameters([&](const std::vector<std::string>& names) {
    for (const std::string& name : names) {
      if (pp_) mine[name] = placement_->whole(name, params[name].detach().clone());
      else out.push_back(export_tensor(model_->options(), name, placement_->whole(name, params[name].detach())));
    }
  });
  if (!pp_) return out;
  for (const auto& [name, t] : placement_->over_stages([&](const std::string& n) { return mine.at(n); }))
    out.push_back(export_tensor(model_->options(), name, t));
  return out;
}

void ParallelModel::add_pieces(std::vector<Piece>& pieces, const Region& region, comm::Group* over) {
  if (!over) {
    pieces.push_back({region.part_numel(), nullptr, -1, 1});
    return;
  }
  const int64_t count = region.is_split() ? region.count : 1;  // 1: every rank of `over` holds it whole
  for (int64_t i = 0; i < count; ++i) pieces.push_back({region.part_numel(), over, i, over->size() / count});
}

bool ParallelModel::holds(const Piece& piece) const {
  return !piece.over || piece.over->rank() / piece.replicas == piece.index;
}

std::vector<int64_t> ParallelModel::writers(const std::vector<Piece>& pieces) const {
  // The ranks holding this stage (every rank without pp) and their coordinates in tp and ep.
  struct Holder {
    int64_t rank, tp, ep;
  };
  std::vector<Holder> ranks;
  if (!mesh_) ranks.push_back({0, 0, 0});
  else
    for (int64_t r = 0; r < mesh_->world_size(); ++r) {
      const MeshCoord c = mesh_->dims().coord(r);
      if (c.pp == mesh_->coord().pp) ranks.push_back({r, c.tp, c.dp % mesh_->dims().ep()});
    }
  std::vector<int64_t> load(ranks.size(), 0), out;
  for (const Piece& piece : pieces) {
    size_t least = ranks.size();
    for (size_t i = 0; i < ranks.size(); ++i) {
      const int64_t coordinate = (piece.over == tp_ ? ranks[i].tp : ranks[i].ep) / piece.replicas;
      if ((!piece.over || coordinate == piece.index) && (least == ranks.size() || load[i] < load[least])) least = i;
    }
    load[least] += piece.numel;
    out.push_back(ranks[least].rank);
  }
  return out;
}

std::vector<TensorSlice> ParallelModel::model_state_shard() {
  // Each written tensor whole, or under tp and ep each rank's part, to one of the ranks holding it.
  const int64_t me = mesh_ ? mesh_->rank() : 0;
  std::vector<Piece> pieces;
  std::vector<std::string> which;  // per piece, its parameter
  for (const auto& item : model_->named_parameters()) {
    if (!placement_->writes(item.key())) continue;
    add_pieces(pieces, placement_->part_region(item.key()), placement_->split_group(item.key()));
    which.resize(pieces.size(), item.key());
  }
  const std::vector<int64_t> writer = writers(pieces);
  std::set<std::string> mine;
  for (size_t i = 0; i < which.size(); ++i)
    if (writer[i] == me && holds(pieces[i])) mine.insert(which[i]);
  auto params = model_->named_parameters();
  std::vector<TensorSlice> out;
  at::NoGradGuard no_grad;
  owner_->visit_full_parameters([&](const std::vector<std::string>& names) {
    for (const std::string& name : names) {
      if (!mine.count(name)) continue;
      auto [stored, values] = export_tensor(model_->options(), name, params[name]);
      out.push_back({stored, values, export_region(model_->options(), name, placement_->part_region(name))});
    }
  });
  return out;
}

void ParallelModel::load_model_state(const ModelReader& reader) {
  std::vector<std::string> params;
  for (const auto& [name, shape] : placement_->whole_shapes()) params.push_back(name);
  check_export_names(config_.model, params, reader.names, reader.source);
  // Under pp this stage's parameters only (the last stage's wte from the one tied embedding).
  auto mine = model_->named_parameters();
  const ModelOptions& options = model_->options();
  for (const auto& [name, shape] : placement_->whole_shapes()) {
    if ((pp_ && !mine.contains(name)) || !owner_->keeps_part_of(name)) continue;
    const std::string stored = export_name(options, name);
    const Region part = placement_->part_region(name), want = export_region(options, name, part);
    const std::vector<int64_t> stored_shape = reader.shape(stored);
    if (stored_shape == want.shape) {
      // This rank's part alone, from the pieces holding it.
      const at::Tensor values = reader.read(stored, want).view(want.part_shape());
      owner_->load_parameter(name, import_tensor(options, name, values, part.part_shape(), reader.source));
    } else {
      // Another shape (an embedding without the padded rows, or one import_tensor refuses by name):
      // read whole and cut.
      const at::Tensor whole = reader.read(stored, Region::whole(stored_shape)).view(stored_shape);
      owner_->load_parameter(name, placement_->part(name, import_tensor(options, name, whole, shape, reader.source)));
    }
  }
  owner_->parameters_loaded();
}

NamedTensors ParallelModel::gradients() {
  NamedTensors grads = owner_->gradients();
  auto params = model_->named_parameters();
  for (auto& [name, g] : grads) g = placement_->whole(name, g.defined() ? g : at::zeros_like(params[name]));
  if (!pp_) return grads;
  const std::map<std::string, at::Tensor> mine(grads.begin(), grads.end());
  return placement_->over_stages([&](const std::string& name) { return mine.at(name); });
}

NamedTensors ParallelModel::training_state() {
  NamedTensors state = owner_->training_state();
  for (auto& [name, t] : state) t = placement_->state_whole(name, t);
  for (auto& entry : routing_state()) state.push_back(std::move(entry));
  return state;
}

void ParallelModel::load_training_state(const std::map<std::string, at::Tensor>& tensors, const std::string& source) {
  load_routing_state(tensors);
  // Under pp the state of this stage's parameters (and any of no parameter, replicated).
  std::map<std::string, at::Tensor> local;
  for (const auto& [name, t] : tensors)
    if (placement_->keeps_state(name)) local.emplace(name, t);
  // This rank's regions come 1-D (an owner taking whole tensors gets its tensor-parallel part in
  // its shape); whole tensors are cut to this rank's part.
  const bool ranged = !owner_->training_state_ranges().empty();
  const OptimizerRanges ranges = training_state_ranges();
  for (auto& [name, t] : local) {
    const auto range = ranges.find(name);
    if (range == ranges.end()) t = placement_->state_part(name, t);
    else if (!ranged && t.numel() == range->second.numel()) t = t.view(range->second.part_shape());
  }
  if (ranged) return owner_->load_training_state_ranges(local, source);
  owner_->load_training_state(local, source);
}

StateKind ParallelModel::state_kind(const std::string& name) const { return owner_->state_kind(name); }

OptimizerRanges ParallelModel::training_state_ranges() const {
  OptimizerRanges own = owner_->training_state_ranges();
  if (!tp_ && !ep_) return own;
  // Under tp or ep each split state tensor's part of the whole: the owner's ZeRO ranges of it, or
  // (an owner holding its state whole) all of it.
  if (own.empty())
    for (const auto& [name, t] : owner_->training_state()) own[name] = Region::whole(t.sizes().vec());
  OptimizerRanges out;
  for (const auto& [name, range] : own) {
    const Region region = placement_->state_region(name, range);
    if (!region.is_whole()) out[name] = region;
  }
  return out;
}

std::vector<TensorSlice> ParallelModel::training_state_slices() {
  std::vector<TensorSlice> out;
  const MeshCoord c = mesh_ ? mesh_->coord() : MeshCoord{};
  if (c.dp == 0 && c.sp == 0 && c.tp == 0)
    for (auto& [name, t] : routing_state()) out.push_back({name, t, Region::whole(t.sizes().vec())});
  for (TensorSlice& slice : state_slices()) out.push_back(std::move(slice));
  return out;
}

std::vector<TensorSlice> ParallelModel::state_slices() {
  // Under pp the ranks holding a stage share out its state, the tied embedding's by the first stage.
  auto written = [&](const std::string& name) { return placement_->writes_state(name); };
  // The owner's own slices (its ZeRO ranges, or its even slice at stage 0), which cover its state
  // over the data-parallel replicas; under tp each is a range of this rank's part, and a tensor
  // not split (the same on every tp rank) is written by tp rank 0.
  if (std::optional<std::vector<TensorSlice>> own = owner_->own_training_state_slices()) {
    std::vector<TensorSlice> out;
    for (TensorSlice& slice : *own) {
      if (!written(slice.name)) continue;
      // A tensor the same on every tp rank is written by tp rank 0, and an expert's tensor that is
      // not split (its step, a scalar) by ep rank 0.
      comm::Group* const cut = placement_->state_split_group(slice.name, slice.region.shape);
      const std::string param = placement_->parameter_of(slice.name);
      if (cut != tp_ && tp_rank_ != 0) continue;
      if (cut == tp_ && tp_rank_ % placement_->replicas(param) != 0) continue;  // a replicated chunk: its first rank
      if (ep_ && cut != ep_ && !param.empty() && placement_->split_group(param) == ep_ && ep_->rank() != 0) continue;
      slice.region = placement_->state_region(slice.name, slice.region);
      out.push_back(std::move(slice));
    }
    return out;
  }
  // Otherwise the owner's state, whole over the data replicas (a collective where it is sharded):
  // each tensor, or under tp or ep each rank's part of a split one, written by one rank holding it.
  NamedTensors local = owner_->training_state();
  local.erase(std::remove_if(local.begin(), local.end(), [&](const auto& item) { return !written(item.first); }),
              local.end());
  const int64_t me = mesh_ ? mesh_->rank() : 0;
  std::vector<Piece> pieces;
  std::vector<size_t> which;  // per piece, its index in local
  for (size_t i = 0; i < local.size(); ++i) {
    const std::vector<int64_t> shape = local[i].second.sizes().vec();
    add_pieces(pieces, placement_->state_region(local[i].first, shape),
               placement_->state_split_group(local[i].first, shape));
    which.resize(pieces.size(), i);
  }
  const std::vector<int64_t> writer = writers(pieces);
  std::vector<TensorSlice> mine;
  for (size_t k = 0; k < which.size(); ++k) {
    if (writer[k] != me || !holds(pieces[k])) continue;
    const auto& [name, t] = local[which[k]];
    mine.push_back({name, t, placement_->state_region(name, t.sizes().vec())});
  }
  return mine;
}

}  // namespace tessera
