// parallel.pp_cut = profile: a short profiling pass measures what each block costs on the device
// the run trains on, and the pipeline cut balances measured time (plan/stage_cut.h, cut_by_time).
//
// profile_blocks builds one block at a time (TransformerLM of a one-block stage, never the whole
// model), as the run computes it: the parameter dtype and autocast of `precision`, the run's
// activation checkpointing, one micro-batch of train.batch_size x train.seq_len tokens, the whole
// block (tensor and sequence parallelism divide every block alike, so the balance holds). Each
// distinct block (by its parameters' names and shapes: dense, mixture-of-experts) is timed once
// and its result used for every block like it: one warm-up, then the median of three passes, each
// timed in the pipeline's three parts: the forward F, the input gradient I and the weight
// gradients W of the split backward (parallel/pipeline/split_backward.h). The embedding alone
// (its I stops at its output, as stage 0's does), and ln_f with the tied head and the loss, are
// timed the same way. Activation bytes: what the device's allocator holds after a block's forward beyond
// before it (the CPU counting allocator, memory/host_memory_stats.h, which the pass installs; the
// CUDA caching allocator's statistics).
//
// profile_world_blocks runs in every worker at start when parallel.pp > 1 (under tensor, sequence
// or expert parallelism only for the profile cut: the whole block it builds may not fit where the
// run's split ones do), before the model is built (a collective of the world): each rank profiles on its own device and the costs are
// averaged over the world, so every rank computes the same cut and prediction from the same
// numbers (plan/layout.h's make_layout cuts by them under pp_cut = profile, and gives any cut
// its stages' measured costs).
#pragma once

#include <c10/core/Device.h>

#include "comm/mesh.h"
#include "plan/stage_cut.h"
#include "config/config.h"

namespace tessera {

BlockCosts profile_blocks(const Config& config, c10::Device device);

BlockCosts profile_world_blocks(const Config& config, comm::Mesh& mesh);

}  // namespace tessera
