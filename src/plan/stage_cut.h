// Cutting the model's blocks into pipeline stages (parallel.pp x the schedule's stages per rank),
// from outside the model: a stage is a contiguous range of blocks, ModelStage{first, end}, and
// the first stage also holds the embeddings, the last ln_f and its copy of the tied embedding
// (the head). No block is ever dropped: the ranges cover 0..n_layer-1 exactly once.
//
//   parallel.pp_cut = layers   as equal block counts as the division allows; with a remainder
//                              the first n_layer mod S stages get one block more (said so in
//                              describe_stage_cut);
//   parallel.pp_cut = params   the contiguous cut minimizing the largest stage's parameters, the
//                              embedding counted with the first stage and the head (ln_f and
//                              the tied embedding's copy) with the last (exact, by dynamic
//                              programming over the block boundaries);
//   parallel.pp_layers = [..]  by hand: the block count of each stage in stage order (method
//                              "hand"; pp_cut is then not used).
//
// Refused naming the keys: more stages than blocks; a hand cut with another number of entries
// than stages, an empty stage, or counts that do not add up to model.n_layer.
//
// pipeline_schedule: the layout's schedule table (parallel.pp_schedule, the stages per rank, and
// the step's micro-batches, which are its accumulation count at this dp) with its parameter
// actions (`gathers`, and OPTIM), built and validated (parallel/pipeline/); refusals name the keys.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/parallel_dims.h"
#include "model/model_options.h"
#include "model/transformer.h"
#include "parallel/pipeline/schedule.h"
#include "train/config.h"

namespace tessera {

struct StageCut {
  std::string method;                   // layers | params | hand
  std::vector<int64_t> boundaries;      // S + 1 entries: stage s holds blocks [boundaries[s], boundaries[s+1])
  std::vector<int64_t> parameters;      // per stage, with the embedding (first) and the head (last)
  int64_t stages() const { return static_cast<int64_t>(boundaries.size()) - 1; }
  bool even() const;                    // every stage has the same number of blocks
};

StageCut cut_stages(const ModelOptions& model, int64_t stages, const std::string& method);
// The cut by hand: stage s holds layers[s] blocks.
StageCut cut_stages(const ModelOptions& model, const std::vector<int64_t>& layers);
// The layout's cut: pp x stages-per-rank stages, by parallel.pp_layers or parallel.pp_cut.
StageCut pipeline_cut(const Config& config, const ParallelDims& dims);

// "stage 0: blocks 0-5 + embedding (43.12M parameters)" per stage, and a note when uneven.
std::string describe_stage_cut(const StageCut& cut);

pipeline::Schedule pipeline_schedule(const Config& config, const ParallelDims& dims,
                                     pipeline::Gathers gathers = pipeline::Gathers::none);

// The part of the model pipeline rank `rank` holds: the blocks of its stages under `schedule`'s
// placement (several ranges with virtual stages), with the embedding if it holds stage 0 and the
// head if it holds the last stage.
ModelStage rank_stage(const StageCut& cut, const pipeline::Schedule& schedule, int64_t rank);

}  // namespace tessera
