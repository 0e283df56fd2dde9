// The parameters of a model stage as declared (name, spec, meta tensor), built on the meta device
// once per model and stage and kept for the process. The planner prices thousands of layouts of
// one model (plan/search.h); building the same 96-block meta model for each was most of its time.
//
// Invariants: an entry's tensor is on the meta device (shape and dtype only, no memory); the key
// is the model's every option and the stage's chunks, so two calls agree exactly with a fresh
// build; safe to call from several threads.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "model/parameter_spec.h"
#include "model/transformer.h"

namespace tessera {

struct CensusEntry {
  std::string name;
  ParameterSpec spec;
  at::Tensor meta;
};
using ParameterCensus = std::vector<CensusEntry>;

// named_parameters() of TransformerLM(model, stage) on the meta device, in its order, with specs.
std::shared_ptr<const ParameterCensus> parameter_census(const ModelOptions& model, const ModelStage& stage = {});

}  // namespace tessera
