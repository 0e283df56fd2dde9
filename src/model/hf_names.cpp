// Export / import name mapping (hf_names.h).
#include "model/hf_names.h"

#include <set>
#include <sstream>

#include <torch/utils.h>

#include "core/error.h"

namespace tessera {
namespace {

// True for the weight of a Linear layer that HF GPT-2 stores as a Conv1D ([in, out]).
bool is_conv1d_weight(const std::string& name) {
  auto ends_with = [&](const std::string& suffix) {
    return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  return ends_with(".c_attn.weight") || ends_with(".c_proj.weight") || ends_with(".c_fc.weight");
}

std::string shape_string(at::IntArrayRef sizes) {
  std::ostringstream out;
  out << sizes;
  return out.str();
}

std::string export_name(bool hf, const std::string& param) { return (hf ? "transformer." : "model.") + param; }

}  // namespace

bool uses_hf_gpt2_names(const ModelOptions& opts) {
  return opts.arch == "gpt" && opts.ffn == "dense" && opts.bias && opts.learned_positions() && !opts.rms_norm() &&
         !opts.swiglu() && opts.tie_embeddings && opts.fused_qkv();
}

NamedTensors export_state(TransformerLMImpl& model) {
  NamedTensors out;
  for (const auto& item : model.named_parameters()) out.push_back(export_tensor(model.options(), item.key(), item.value()));
  return out;
}

std::pair<std::string, at::Tensor> export_tensor(const ModelOptions& opts, const std::string& param,
                                                 const at::Tensor& value) {
  const bool hf = uses_hf_gpt2_names(opts);
  const at::Tensor t = value.detach();
  return {export_name(hf, param), hf && is_conv1d_weight(param) ? t.t().contiguous() : t.clone()};
}

std::string export_name(const ModelOptions& opts, const std::string& param) {
  return export_name(uses_hf_gpt2_names(opts), param);
}

Region export_region(const ModelOptions& opts, const std::string& param, const Region& region) {
  if (!uses_hf_gpt2_names(opts) || !is_conv1d_weight(param) || region.shape.size() != 2) return region;
  require(region.begin == 0 && region.end == region.part_numel(), "internal: a range of a transposed part of '", param,
          "' has no region in the export layout");
  return Region::split({region.shape[1], region.shape[0]}, region.is_split() ? 1 - region.dim : -1, region.blocks,
                       region.index, region.count);
}

at::Tensor import_tensor(const ModelOptions& o, const std::string& param, const at::Tensor& stored,
                         at::IntArrayRef expected, const std::string& source) {
  const bool transposed = uses_hf_gpt2_names(o) && is_conv1d_weight(param);
  at::Tensor value = transposed && stored.dim() == 2 ? stored.t() : stored;
  // An embedding or an untied head without the padded rows (an exported or Hugging Face file):
  // zeros fill them (the model never reads them: model.vocab_multiple).
  if ((param == "wte.weight" || param == "lm_head.weight") && value.dim() == 2 && expected.size() == 2 &&
      value.size(0) == o.vocab_size && expected[0] == o.padded_vocab() && value.size(1) == expected[1] &&
      o.padded_vocab() > o.vocab_size)
    value = at::cat({value, at::zeros({o.padded_vocab() - o.vocab_size, value.size(1)}, value.options())});
  if (value.sizes() != expected) {
    const std::vector<int64_t> stored_shape =
        transposed && expected.size() == 2 ? std::vector<int64_t>{expected[1], expected[0]} : expected.vec();
    fail(source, ": tensor '", export_name(o, param), "' has shape ", shape_string(stored.sizes()),
         ", the model expects ", shape_string(stored_shape), " (model.vocab_size = ", o.vocab_size,
         ", model.n_embd = ", o.n_embd, ", model.block_size = ", o.block_size, ", model.mlp_ratio = ", o.mlp_ratio,
         ", model.moe_experts = ", o.moe_experts, ")");
  }
  return value;
}

void check_export_names(const ModelOptions& o, const std::vector<std::string>& params,
                        const std::set<std::string>& names, const std::string& source) {
  std::set<std::string> expected;
  for (const auto& p : params) expected.insert(export_name(o, p));
  for (const auto& name : names)
    require(expected.count(name), source, ": unexpected tensor '", name, "' (the model is arch ", o.arch, ", ffn ",
            o.ffn, ", bias ", o.bias ? "true" : "false", ", n_layer ", o.n_layer, ")");
  for (const auto& name : expected) require(names.count(name), source, ": missing tensor '", name, "'");
}

void import_state(TransformerLMImpl& model, const std::map<std::string, at::Tensor>& tensors,
                  const std::string& source) {
  const auto& o = model.options();
  std::vector<std::string> params;
  std::set<std::string> names;
  for (const auto& item : model.named_parameters()) params.push_back(item.key());
  for (const auto& [name, t] : tensors) names.insert(name);
  check_export_names(o, params, names, source);
  torch::NoGradGuard no_grad;
  for (auto& item : model.named_parameters())
    item.value().copy_(import_tensor(o, item.key(), tensors.at(export_name(o, item.key())), item.value().sizes(), source));
}

}  // namespace tessera
