// Initialising a model's parameters from their declarations (model/parameter_spec.h).
//
// Each parameter is drawn on the CPU from its own generator, seeded by mix(seed, global name), and
// copied to its device: the values depend only on the seed and the name, not on which other
// parameters this process builds (a pipeline stage), their order, or the device. Parameters on
// the meta device are left alone (they have no storage).
#pragma once

#include <cstdint>

#include <torch/nn/module.h>

#include "model/parameter_spec.h"

namespace tessera {

// Initialises every parameter of `module` (named as in its named_parameters()) by `specs`.
// Throws tessera::Error naming a parameter without a declaration.
void initialize_parameters(torch::nn::Module& module, const ParameterSpecs& specs, uint64_t seed);

// The initial value of parameter `name` (its global name) of the whole `shape`, float32 on the
// CPU: what initialize_parameters gives it. A rank that holds a part of the parameter (a
// tensor-parallel shard) draws the whole value and keeps its part (parallel/parallelize.h).
at::Tensor initial_value(const ParameterInit& init, const std::string& name, at::IntArrayRef shape, uint64_t seed);

// A seed drawn from torch's default CPU generator (so torch::manual_seed(s) before building a model
// fixes its parameters, as it did when each layer drew its own).
uint64_t draw_model_seed();

}  // namespace tessera
