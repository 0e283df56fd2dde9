// Layout: the one description of how a run is laid out, computed once from the resolved config and
// the mesh's degrees and never changed after. parallelize() (parallel/parallelize.h), the step
// runners, `tessera inspect`, `train --dry-run`, `tessera swap-plan` and the memory estimate read
// the same value; the config itself is never written after it is resolved.
//
// What it holds:
//   dims        the degrees (core/parallel_dims.h)
//   cut         parallel.pp > 1: the pipeline cut (plan/stage_cut.h), by hand, by layers, by
//               parameters, or by measured time when the workers profiled the blocks
//               (parallel.pp_cut = profile with LayoutMeasurements::blocks; without them, as in a
//               dry run, the parameter cut, method "params until profiled"); with the blocks
//               profiled, whatever the cut, its stages' measured F, B, I, W (the prediction)
//   schedule    parallel.pp > 1: the schedule table for the step's micro-batches (its placement
//               decides which pipeline rank holds each stage), with the parameter gathers of
//               ZeRO-3 over the stages' data replicas (layout_gathers) and OPTIM: the table a
//               run starts with; PipelineTable (plan/pipeline_table.h) decides from it what each
//               step runs (another micro-batch count, the table for measured costs after step 2)
//   swap        memory.swap with LayoutMeasurements::swap: the swap plan (plan/swap_cut.h), whose
//               sub-models are the units the swap engine moves; absent without measurements
//   activations memory.activation_policy = auto with LayoutMeasurements::blocks: each pipeline
//               rank's choice for its blocks (one without a pipeline) of checkpointing, offload and
//               encoding (plan/activation_policy.h); absent otherwise (the keys apply to every
//               block as given)
//   replicas    the names of the groups gradients are averaged over: dense parameters over "dp"
//               (or "dp_sp" with sequence parallelism), expert parameters over "edp" ("edp_sp")
//
// make_layout refuses, naming the keys, what cannot be cut or scheduled (stage_cut.h's refusals).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "comm/mesh.h"
#include "core/parallel_dims.h"
#include "memory/swap/swap_plan.h"
#include "model/transformer.h"
#include "parallel/pipeline/schedule.h"
#include "plan/activation_policy.h"
#include "plan/stage_cut.h"
#include "plan/swap_cut.h"
#include "config/config.h"

namespace tessera {

// What a layout needs measured on the device before it can be made (measure_layout).
struct LayoutMeasurements {
  // The world's mean block costs: parallel.pp > 1 (plan/profile_cut.h says when), and
  // memory.activation_policy = auto.
  std::optional<BlockCosts> blocks;
  std::optional<SwapCosts> swap;     // memory.swap: the blocks' swap costs on this rank's device
  bool cpu_device = true;            // where they were measured
};

// The group dense gradients are averaged over: "dp", or "dp_sp" with sequence parallelism.
inline std::string replica_group_name(const ParallelDims& dims) { return dims.sp() > 1 ? "dp_sp" : "dp"; }

class Layout {
 public:
  Layout(ParallelDims dims, std::optional<StageCut> cut, std::optional<pipeline::Schedule> schedule,
         std::optional<swap::SwapPlan> swap, std::vector<ActivationPolicy> activations = {});

  const ParallelDims& dims() const { return dims_; }
  bool pipelined() const { return cut_.has_value(); }
  // parallel.pp > 1 only (refused otherwise, as an internal error).
  const StageCut& cut() const;
  const pipeline::Schedule& schedule() const;
  // The part of the model pipeline rank `pp_rank` builds: its stages' blocks (several ranges with
  // virtual stages), the embedding with stage 0, the head with the last stage; the whole model
  // without pipeline parallelism.
  ModelStage stage_of(int64_t pp_rank) const;
  // The pipeline rank holding block `block`, the embedding (stage 0) and the head (the last stage).
  int64_t block_holder(int64_t block) const;
  int64_t embedding_holder() const;
  int64_t head_holder() const;

  bool swapped() const { return swap_.has_value(); }
  const swap::SwapPlan& swap_plan() const;

  // memory.activation_policy = auto, measured: pipeline rank `pp_rank`'s choice for its blocks
  // (0 without a pipeline); null otherwise.
  const ActivationPolicy* activation_policy(int64_t pp_rank = 0) const;
  const std::vector<ActivationPolicy>& activation_policies() const { return activations_; }

  // The groups the data replicas average over: dense and expert parameters (comm/mesh.h's names).
  std::string replica_group() const { return replica_group_name(dims_); }
  std::string expert_replica_group() const { return dims_.sp() > 1 ? "edp_sp" : "edp"; }

 private:
  ParallelDims dims_;
  std::optional<StageCut> cut_;
  std::optional<pipeline::Schedule> schedule_;
  std::optional<swap::SwapPlan> swap_;
  std::vector<ActivationPolicy> activations_;
};

// The parameter actions a layout's pipeline table holds: ZeRO-3 (parallel.zero_stage = 3) over a
// pipeline whose stages have data replicas to shard over (dp x sp > 1) or offload gathers each
// stage's parameters by the table, once per step or, with
// parallel.zero3_reshard_per_microbatch, around every compute action; otherwise none. The one
// place that decides it: DataParallel is the owner exactly then (parallel/parallelize.h), and the
// pipeline step checks that its owner agrees.
pipeline::Gathers layout_gathers(const ParallelOptions& parallel, const ParallelDims& dims);

Layout make_layout(const Config& config, const ParallelDims& dims, const LayoutMeasurements& measured = {});

// What the run's start prints of its layout: the pipeline's cut, schedule and bubble
// (describe_pipeline_layout), the swap plan (describe_swap_plan) and the activation policy
// (describe_activation_policy), without a final newline; empty for a layout with none.
std::string describe_layout(const Config& config, const Layout& layout);

// Takes what make_layout needs measured on `device`: under parallel.pp_cut = profile or
// memory.activation_policy = auto the block costs, averaged over the world (a collective of
// `mesh`'s world; plan/profile_cut.h); under memory.swap the swap costs of this rank's device
// (plan/swap_cut.h). Nothing otherwise.
LayoutMeasurements measure_layout(const Config& config, comm::Mesh* mesh, c10::Device device);

}  // namespace tessera
