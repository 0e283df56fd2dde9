// ParameterPlacement: the whole <-> part routine over tp, ep and pp (parameter_placement.h).
#include "parallel/parameter_placement.h"

#include <ATen/ATen.h>

#include "core/error.h"
#include "optim/optimizer.h"

namespace tessera {

ParameterPlacement::ParameterPlacement(const TransformerLM& model, const Layout& layout, comm::Group* tp,
                                       comm::Group* pp, comm::Group* ep)
    : model_(model), layout_(layout), tp_(tp), pp_(pp), ep_(ep && ep->size() > 1 ? ep : nullptr) {
  // The whole model's declarations and shapes, from a model on the meta device (no memory).
  const TransformerLM whole(model_->options(), ModelStage{}, at::TensorOptions().device(at::kMeta));
  whole_specs_ = whole->parameter_specs();
  for (const auto& item : whole->named_parameters()) {
    position_[item.key()] = whole_shapes_.size();
    whole_shapes_.emplace_back(item.key(), item.value().sizes().vec());
  }
}

ParameterPlacement::Cut ParameterPlacement::cut(const std::string& param) const {
  const ParameterSpec& spec = model_->parameter_specs().at(param);
  if (spec.split == Split::expert) return ep_ ? Cut{{0, 1}, ep_} : Cut{};
  if (!tp_) return {};
  const TensorParallelLayout layout = tensor_parallel_layout(spec, tp_->size());
  return layout.dim >= 0 ? Cut{layout, tp_} : Cut{};
}

comm::Group* ParameterPlacement::split_group(const std::string& param) const { return cut(param).group; }

at::Tensor ParameterPlacement::part(const std::string& param, const at::Tensor& whole) const {
  const Cut c = cut(param);
  return c.group ? shard_tensor(whole, c.layout, c.group->rank(), c.group->size()) : whole;
}

at::Tensor ParameterPlacement::whole(const std::string& param, const at::Tensor& part) const {
  const Cut c = cut(param);
  return c.group ? gather_tensor(part.contiguous(), c.layout, *c.group) : part;
}

Region ParameterPlacement::part_region(const std::string& param) const {
  const std::vector<int64_t>& shape = whole_shape(param);
  const Cut c = cut(param);
  if (!c.group) return Region::whole(shape);
  return Region::split(shape, c.layout.dim, c.layout.parts, c.index(), c.count());
}

int64_t ParameterPlacement::replicas(const std::string& param) const {
  const Cut c = cut(param);
  return c.group ? c.layout.replicas : 1;
}

ParameterPlacement::Cut ParameterPlacement::state_cut(const std::string& state, const std::vector<int64_t>& shape) const {
  if (shape.empty()) return {};
  const std::string param = parameter_of(state);
  if (!model_->parameter_specs().count(param)) return {};
  const Cut c = cut(param);
  // A state tensor of another rank than its parameter's (Adafactor's factored rows) is not cut.
  if (!c.group || static_cast<int64_t>(shape.size()) <= c.layout.dim) return {};
  return c;
}

comm::Group* ParameterPlacement::state_split_group(const std::string& state, const std::vector<int64_t>& shape) const {
  return state_cut(state, shape).group;
}

Region ParameterPlacement::state_region(const std::string& state, const std::vector<int64_t>& local) const {
  const Cut c = state_cut(state, local);
  if (!c.group) return Region::whole(local);
  std::vector<int64_t> shape = local;
  shape[static_cast<size_t>(c.layout.dim)] *= c.count();
  return Region::split(shape, c.layout.dim, c.layout.parts, c.index(), c.count());
}

Region ParameterPlacement::state_region(const std::string& state, const Region& slice) const {
  const Region part = state_region(state, slice.shape);
  return part.is_split() ? part.sub(slice.begin, slice.end) : slice;
}

bool ParameterPlacement::writes(const std::string& param) const {
  return !(pp_ && model_->parameter_specs().at(param).tied && model_->has_head() && !model_->has_embedding());
}

std::string ParameterPlacement::parameter_of(const std::string& state) const {
  if (state.rfind("master.", 0) == 0) return state.substr(7);
  if (state.rfind("optim.", 0) != 0) return "";
  const std::string rest = state.substr(6);
  const std::string param = parameter_of_state(rest);
  return param.empty() ? rest : param;
}

at::Tensor ParameterPlacement::state_part(const std::string& state, const at::Tensor& whole) const {
  const Cut c = state_cut(state, whole.sizes().vec());
  return c.group ? shard_tensor(whole, c.layout, c.group->rank(), c.group->size()) : whole;
}

at::Tensor ParameterPlacement::state_whole(const std::string& state, const at::Tensor& part) const {
  const Cut c = state_cut(state, part.sizes().vec());
  return c.group ? gather_tensor(part.contiguous(), c.layout, *c.group) : part;
}

bool ParameterPlacement::keeps_state(const std::string& state) const {
  const std::string param = parameter_of(state);
  return !pp_ || param.empty() || model_->parameter_specs().count(param) > 0;
}

bool ParameterPlacement::writes_state(const std::string& state) const {
  const std::string param = parameter_of(state);
  return param.empty() || writes(param);
}

int64_t ParameterPlacement::holder(const std::string& param) const {
  const ParameterSpec& spec = whole_specs_.at(param);
  if (spec.block >= 0) return layout_.block_holder(spec.block);
  return spec.end == ModelEnd::head ? layout_.head_holder() : layout_.embedding_holder();
}

NamedTensors ParameterPlacement::over_stages(const std::function<at::Tensor(const std::string& param)>& mine) const {
  require(pp_ != nullptr, "internal: assembling the stages without a pipeline");
  const at::Device device = model_->parameters().front().device();
  NamedTensors out;
  for (const auto& [name, shape] : whole_shapes_) {
    const int64_t from = holder(name);
    at::Tensor t = from == pp_->rank() ? mine(name).to(at::kFloat).contiguous()
                                       : at::empty(shape, at::TensorOptions().dtype(at::kFloat).device(device));
    pp_->broadcast(t, from);
    out.emplace_back(name, t);
  }
  return out;
}

}  // namespace tessera
