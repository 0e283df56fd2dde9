// The layout validator: refuses, naming the keys and the reason, a layout this build cannot train,
// before any worker starts (the launcher, `tessera bench`) and again in every worker (TrainStep).
// It calls each component's own check (check_expert_parallel, check_tensor_parallel,
// check_sequence_parallel, check_data_parallel), builds the layout (plan/layout.h: the cut and the
// schedule for the step's micro-batches), checks the names that only their components know
// (parallel.pp_schedule: pipeline::schedule_names(); parallel.grad_compression: compressor_names())
// and makes the refusals that belong to no component (fp16 with parallelism or offload, what
// swapping and pipelines do not combine with, the backend for the device).
#pragma once

#include "config/config.h"
#include "core/parallel_dims.h"

namespace tessera {

// Everything, including what depends on this machine's build (the backend for the device).
void check_parallel_layout(const Config& config, const ParallelDims& dims);
// The same without the checks that depend on this machine's build: what a layout is, wherever it
// runs (`tessera inspect` and `tessera swap-plan` plan for machines they are not on).
void check_layout_options(const Config& config, const ParallelDims& dims);

}  // namespace tessera
