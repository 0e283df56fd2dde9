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
//   parallel.pp_cut = profile  the contiguous cut minimizing the slowest stage's measured forward
//                              + backward time of one micro-batch, the embedding counted with the
//                              first stage and the head and loss with the last
//                              (plan/profile_cut.h measures them in the workers at start; until
//                              then, e.g. in a dry run, the cut is the parameter cut and says so);
//                              the workers profile the blocks under every cut, which then shows
//                              each stage's measured F, I, W and the step they predict;
//   parallel.pp_layers = [..]  by hand: the block count of each stage in stage order (method
//                              "hand"; pp_cut is then not used).
//
// Refused naming the keys: more stages than blocks; a hand cut with another number of entries
// than stages, an empty stage, or counts that do not add up to model.n_layer.
//
// The layout's schedule table is parallel/pipeline/schedule_builders.h's schedule_for_options.
#pragma once

#include <cstdint>
#include <optional>
#include <map>
#include <string>
#include <vector>

#include "core/parallel_dims.h"
#include "model/model_options.h"
#include "model/transformer.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/simulate.h"
#include "config/config.h"

namespace tessera {

// Measured costs of one micro-batch, per block and for the ends (plan/profile_cut.h).
struct BlockCosts {
  std::vector<double> block_seconds;           // per block: forward + backward
  std::vector<double> block_activation_bytes;  // per block: held from its forward to its backward
  double embedding_seconds = 0;                // token and position embedding, forward + backward
  double head_seconds = 0;                     // ln_f, the tied head and the loss, forward + backward
  // The same, split as the pipeline runs them (parallel/pipeline/split_backward.h): forward F,
  // input gradient I, weight gradients W, and the whole backward B (timed apart: less than I + W by
  // what computing the halves apart costs); the seconds above are F + B. Empty where only the
  // totals were given.
  std::vector<pipeline::ActionCosts::Compute> block_split;
  pipeline::ActionCosts::Compute embedding_split, head_split;
  // On a CPU "device": bytes per second of a copy into fresh memory, what activation offload's
  // copies cost the computing cores (plan/activation_policy.h); 0 on CUDA (copy engines).
  double copy_bytes_per_s = 0;
  // Under memory.activation_policy = auto, for each codec memory.activation_compression allows (by
  // its name): seconds to encode and decode one byte of an activation of the compute dtype (plan/
  // activation_policy.h); empty otherwise.
  std::map<std::string, double> codec_seconds_per_byte;
  // On CUDA: bytes per second of the host link (to pinned host memory and back, the slower way),
  // what activation offload's copies cross; 0 on a CPU "device", whose link is modelled
  // (memory.modelled_bandwidth_gbps).
  double link_bytes_per_s = 0;
};

struct StageCut {
  std::string method;                   // layers | params | profile | hand (| "params until profiled")
  std::vector<int64_t> boundaries;      // S + 1 entries: stage s holds blocks [boundaries[s], boundaries[s+1])
  std::vector<int64_t> parameters;      // per stage, with the embedding (first) and the head (last)
  // Measured (the profile cut, and any cut of a run whose workers profiled the blocks; else empty),
  // per stage and micro-batch: forward + backward, activation bytes, and F, B, I, W.
  std::vector<double> seconds;
  std::vector<double> activation_bytes;
  std::vector<pipeline::ActionCosts::Compute> compute;
  int64_t stages() const { return static_cast<int64_t>(boundaries.size()) - 1; }
  bool even() const;                    // every stage has the same number of blocks
};

// By "layers" or "params".
StageCut cut_stages(const ModelOptions& model, int64_t stages, const std::string& method);
// By measured time ("profile").
StageCut cut_by_time(const ModelOptions& model, int64_t stages, const BlockCosts& costs);
// The cut by hand: stage s holds layers[s] blocks.
StageCut cut_stages(const ModelOptions& model, const std::vector<int64_t>& layers);
// Fills `cut`'s measured seconds, activation bytes and (where `costs` has the split) F, B, I, W
// per stage from the blocks' and the ends' costs.
void add_measured_costs(StageCut& cut, const BlockCosts& costs);
// The cut of pp x stages-per-rank stages by parallel.pp_layers or parallel.pp_cut, without
// measurements (profile: the parameter cut, method "params until profiled"; plan/layout.h's
// make_layout cuts by the workers' measured time instead).
StageCut pipeline_cut(const Config& config, const ParallelDims& dims);

// "stage 0: blocks 0-5 + embedding (43.12M parameters)" per stage, and a note when uneven.
std::string describe_stage_cut(const StageCut& cut);

// "pipeline: 1f1b, 4 ranks x 1 stage(s), cut by layers:", the stages (describe_stage_cut) and the
// schedule's simulated bubble at equal costs, for a layout's cut and schedule (plan/layout.h);
// with the stages' measured F, I, W also the predicted step (predicted_step) and its bubble.
std::string describe_pipeline_layout(const Config& config, const ParallelDims& dims, const StageCut& cut,
                                     const pipeline::Schedule& schedule);
// The costs a step is predicted from: the cut's measured F, B, I, W per stage (nullopt without
// them, or under tensor, sequence or expert parallelism, which split the blocks the profile timed
// whole). predicted_step: the schedule simulated with them, the step that the start-up print
// predicts and the pipeline step checks (parallel/pipeline_step.h).
std::optional<pipeline::ActionCosts> predicted_costs(const ParallelDims& dims, const StageCut& cut);
std::optional<pipeline::Simulation> predicted_step(const ParallelDims& dims, const StageCut& cut,
                                                   const pipeline::Schedule& schedule);
// The run's step after which the pipeline step compares its measured step with predicted_step.
inline constexpr int64_t kPredictionCheckedAtStep = 3;

// The part of the model pipeline rank `rank` holds: the blocks of its stages under `schedule`'s
// placement (several ranges with virtual stages), with the embedding if it holds stage 0 and the
// head if it holds the last stage.
ModelStage rank_stage(const StageCut& cut, const pipeline::Schedule& schedule, int64_t rank);

}  // namespace tessera
