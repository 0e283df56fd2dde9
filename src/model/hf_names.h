// Parameter naming for export and import (safetensors checkpoints, DESIGN.md "User-facing contracts").
//
// A model with the exact Hugging Face GPT-2 layout (arch gpt, ffn dense, bias true) is written
// with GPT2LMHeadModel's names, so `transformers` loads it:
//   wte.weight -> transformer.wte.weight, wpe.weight -> transformer.wpe.weight,
//   h.{i}.<...> -> transformer.h.{i}.<...>, ln_f.<...> -> transformer.ln_f.<...>;
//   HF's Conv1D stores a weight as [in, out], so the weights of the Linear layers c_attn, c_proj
//   and c_fc ([out, in] here) are transposed. lm_head.weight is tied to wte and not written.
// Any other model is written with its internal names prefixed "model." and no transposition.
// import_state is the exact inverse and refuses missing, unexpected or mis-shaped tensors.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "checkpoint/region.h"
#include "checkpoint/safetensors.h"
#include "model/transformer.h"

namespace tessera {

// Whether export_state uses the Hugging Face GPT-2 names for this model.
bool uses_hf_gpt2_names(const ModelOptions& opts);

// The model's parameters under their export names (copies, in the export layout).
NamedTensors export_state(TransformerLMImpl& model);
// One parameter's export name and its whole value `value` in the export layout, in memory of its
// own (a copy, never a view of `value`): what export_state gives for it.
std::pair<std::string, at::Tensor> export_tensor(const ModelOptions& opts, const std::string& param,
                                                 const at::Tensor& value);

// Parameter `param`'s export name.
std::string export_name(const ModelOptions& opts, const std::string& param);
// The region (checkpoint/region.h) of parameter `param`'s export-layout tensor that holds `region`
// of it in the model's layout (a transposed weight's split moves to the other dimension). A
// tensor-parallel part is written and read this way without being gathered.
Region export_region(const ModelOptions& opts, const std::string& param, const Region& region);
// Parameter `param`'s value in the model's layout from its export-layout tensor `stored` (a view
// where it is transposed), checked against the whole parameter's shape `expected`; throws
// tessera::Error naming `source`, the tensor and the model keys that set the shape.
at::Tensor import_tensor(const ModelOptions& opts, const std::string& param, const at::Tensor& stored,
                         at::IntArrayRef expected, const std::string& source);
// Refuses, naming `source`, export names in `names` that no parameter in `params` has (an
// unexpected tensor) and parameters whose export name `names` lacks (a missing one).
void check_export_names(const ModelOptions& opts, const std::vector<std::string>& params,
                        const std::set<std::string>& names, const std::string& source);

// Copies `tensors` (export names) into the model's parameters under NoGradGuard, converting dtype
// and device. Throws tessera::Error naming `source` and the tensor when a parameter is missing, a
// tensor is unexpected, or a shape differs.
void import_state(TransformerLMImpl& model, const std::map<std::string, at::Tensor>& tensors,
                  const std::string& source);

}  // namespace tessera
