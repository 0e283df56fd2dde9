// ParameterPlacement: the whole <-> part routine over tp and pp (parameter_placement.h).
#include "parallel/parameter_placement.h"

#include <ATen/ATen.h>

#include "core/error.h"

namespace tessera {

ParameterPlacement::ParameterPlacement(const TransformerLM& model, const Layout& layout, comm::Group* tp,
                                       comm::Group* pp)
    : model_(model), layout_(layout), tp_(tp), pp_(pp) {
  // The whole model's declarations and shapes, from a model on the meta device (no memory).
  const TransformerLM whole(model_->options(), ModelStage{}, at::TensorOptions().device(at::kMeta));
  whole_specs_ = whole->parameter_specs();
  for (const auto& item : whole->named_parameters()) {
    position_[item.key()] = whole_shapes_.size();
    whole_shapes_.emplace_back(item.key(), item.value().sizes().vec());
  }
}

TensorParallelLayout ParameterPlacement::split(const std::string& param) const {
  return tensor_parallel_layout(model_->parameter_specs().at(param));
}

at::Tensor ParameterPlacement::part(const std::string& param, const at::Tensor& whole) const {
  if (!tp_) return whole;
  return shard_tensor(whole, split(param), tp_->rank(), tp_->size());
}

at::Tensor ParameterPlacement::whole(const std::string& param, const at::Tensor& part) const {
  if (!tp_) return part;
  return gather_tensor(part.contiguous(), split(param), *tp_);
}

Region ParameterPlacement::part_region(const std::string& param) const {
  const ParameterSpec& spec = model_->parameter_specs().at(param);
  const std::vector<int64_t>& shape = whole_shape(param);
  if (!tp_) return Region::whole(shape);
  const TensorParallelLayout layout = tensor_parallel_layout(spec);
  return Region::split(shape, layout.dim, layout.parts, tp_->rank(), tp_->size());
}

Region ParameterPlacement::state_region(const std::string& state, const std::vector<int64_t>& local) const {
  const auto layout = state_split(state, at::empty(local, at::TensorOptions().device(at::kMeta)));
  if (!layout) return Region::whole(local);
  std::vector<int64_t> shape = local;
  shape[static_cast<size_t>(layout->dim)] *= tp_->size();
  return Region::split(shape, layout->dim, layout->parts, tp_->rank(), tp_->size());
}

bool ParameterPlacement::writes(const std::string& param) const {
  return !(pp_ && model_->parameter_specs().at(param).tied && model_->has_head() && !model_->has_embedding());
}

std::string ParameterPlacement::parameter_of(const std::string& state) const {
  for (const char* prefix : {"optim.", "master."})
    if (state.rfind(prefix, 0) == 0) {
      const std::string rest = state.substr(std::string(prefix).size());
      const size_t dot = rest.rfind('.');
      return prefix == std::string("master.") || dot == std::string::npos ? rest : rest.substr(0, dot);
    }
  return "";
}

std::optional<TensorParallelLayout> ParameterPlacement::state_split(const std::string& state,
                                                                 const at::Tensor& t) const {
  if (!tp_ || t.dim() == 0) return std::nullopt;
  const auto spec = model_->parameter_specs().find(parameter_of(state));
  if (spec == model_->parameter_specs().end()) return std::nullopt;
  const TensorParallelLayout layout = tensor_parallel_layout(spec->second);
  if (layout.dim < 0) return std::nullopt;
  return layout;
}

at::Tensor ParameterPlacement::state_part(const std::string& state, const at::Tensor& whole) const {
  const auto layout = state_split(state, whole);
  return layout ? shard_tensor(whole, *layout, tp_->rank(), tp_->size()) : whole;
}

at::Tensor ParameterPlacement::state_whole(const std::string& state, const at::Tensor& part) const {
  const auto layout = state_split(state, part);
  return layout ? gather_tensor(part.contiguous(), *layout, *tp_) : part;
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
