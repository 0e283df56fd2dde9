// DataParallel's state, shared by its implementation files: data_parallel.cpp (construction,
// gradient reductions, clipping, the step), zero3.cpp (stage 3's parameter gathering) and
// sharded_state.cpp (whole-tensor optimizer state). Internal to src/parallel/data.
//
// Invariants:
// - `reductions` lists the gradient reductions in the one order every rank launches them;
//   reductions[0, next_launch) are launched in the current backward.
// - Stages 0-1: grad_views[i] is parameters i's .grad, a view of its bucket's `grad`.
// - Stages 2-3: no parameter holds a gradient between backward passes; the dp sum of this rank's
//   part is in grad_shards, divided by N (the dp mean) as soon as the unit's reduce-scatter of the
//   last micro-batch is collected.
// - Offload (stages 1-3): the optimizer's leaves are views of offload's host masters; the host
//   gradients are filled per bucket (stage 1) or unit (stages 2-3) once the device values are the
//   dp mean, and the shards are written from the masters after each step.
// - Tensor parallelism's gradient shares (parallel/tensor/gradient_shares.h): summed over their
//   groups in finish_gradients, after every reduction over the replicas; with offload a bucket or
//   unit holding shares goes to the host only after that sum.
// - Stage 3: `residency` (memory/residency/residency.h), over `home` (the units' shards,
//   memory/residency/sharded_home.h), brings `units` in and out, by the ZeRO-3
//   plan over the whole model or by the pipeline schedule's holds over a stage: a unit (a
//   block's, or the ends') is materialized only between its fetch and its release.
// - Reduction groups: groups[0] is `dp` (every replica); groups[1], present only when it has
//   other members, the expert-data-parallel group. A bucket or a unit holds parameters of one
//   group only and is reduced, sharded and gathered over it. The units of a part are consecutive
//   in `units` and in the reduction order (dense, then experts).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <vector>

#include <ATen/core/Tensor.h>

#include "comm/group.h"
#include "core/error.h"
#include "optim/compression/compressor.h"
#include "optim/optimizer.h"
#include "parallel/data/data_parallel.h"
#include "memory/residency/flat_unit.h"
#include "memory/offload/offload.h"
#include "memory/residency/residency.h"
#include "memory/residency/sharded_home.h"

namespace tessera {

struct DataParallel::Impl {
  struct Bucket {
    std::vector<size_t> params;  // indices into `params`
    at::Tensor grad;             // [sum of numel]: the parameters' .grad are views of it
    comm::Work work;
    size_t group = 0;            // index into `groups`
  };
  struct Reduction {
    size_t index;  // bucket (stages 0-1) or unit (stages 2-3)
    int64_t expected, arrived = 0;
  };
  struct PendingScatter {
    comm::Work work;
    size_t unit;
    bool last;                 // of the last micro-batch: the unit's gradient is final once collected
    at::Tensor input, output;  // [N * S] full gradients, [S] this rank's sum
  };

  TransformerLM model;
  comm::Group& dp;                    // every replica: the clipping norm and the steps are summed over it
  std::vector<comm::Group*> groups;   // the reduction groups (see above)
  int64_t stage, n_blocks;
  NamedParams params;  // the model's, in registration order
  std::vector<size_t> group_of;  // per parameter: its reduction group, an index into `groups`
  std::unique_ptr<Optimizer> optimizer;
  ElementwiseState state_slots;  // the optimizer's per-parameter state, sharded at stages 1-3
  std::unique_ptr<GradientCompressor> compressor;
  std::unique_ptr<OffloadedShard> offload;  // parallel.offload
  ModelParallelNorm norm;                    // tensor parallelism's weights in the clipping norm
  GradientShares shares;                     // tensor parallelism's shares, summed in finish_gradients
  int64_t block_wrapper = -1, end_wrapper = -1;  // stage 3: the model's wrapper ids

  std::vector<Bucket> buckets;          // stages 0-1
  std::vector<at::Tensor> grad_views;   // stages 0-1: per parameter, its .grad (a view of its bucket)
  // stages 1-3: per part (the model's blocks, then the ends) one per group (and a pipeline
  // stage's tied embedding one of its own)
  std::vector<FlatUnit> units;
  std::vector<size_t> unit_part;        // per unit: its part, l for block l, n_blocks for the ends
  std::vector<std::vector<size_t>> part_units;  // per part: its units
  std::vector<at::Tensor> grad_shards;  // stages 2-3: per unit, [S]
  // Stage 3 over `units`: over the whole model with the ZeRO-3 plan (its wrappers run it), over
  // a pipeline stage without one (the schedule holds and drops parts: fetch_stage, release_stage).
  std::unique_ptr<ShardedHome> home;  // the units' home: their shards over the groups
  std::unique_ptr<Residency> residency;

  std::vector<Reduction> reductions;  // in launch order
  std::vector<size_t> reduction_of;   // per parameter
  std::vector<char> arrived;          // per parameter, in this backward
  size_t next_launch = 0;
  bool armed = false;     // before_backward was called and finish_gradients not yet
  bool reducing = false;  // this backward's gradients are reduced
  bool last_micro_batch = false;
  std::deque<PendingScatter> scatters;
  // Per reduction: part of this backward (a pipeline stage's backward at stages 2-3 reduces the
  // units of that stage only; 1 for every reduction otherwise).
  std::vector<char> in_window;
  std::vector<char> finalized;  // stages 2-3, per unit: its gradient is this step's mean already
  // Stage 3 over the whole model during the adaptive codecs' probe (run_probe): the wrappers hold
  // each block around its forward and, from its CallInBackward, its backward (the part held for a
  // backward until the next one's, or the probe's end); the ends are held throughout.
  bool probing = false;
  std::optional<size_t> probe_backward_part;

  Impl(TransformerLM m, const ReductionGroups& reduction, const ParallelOptions& parallel)
      : model(std::move(m)), dp(*reduction.data), stage(parallel.zero_stage), n_blocks(model->options().n_layer) {
    groups.push_back(reduction.data);
    if (reduction.expert_data && reduction.expert_data != reduction.data) groups.push_back(reduction.expert_data);
  }
  comm::Group& group(size_t g) const { return *groups[g]; }
  // The parts (blocks, n_blocks for the ends) of a pipeline stage.
  std::vector<size_t> parts_of(const ModelStage& stage) const;
  // The reductions that belong to blocks after `layer` (stages 2-3 launch them in that order first).
  size_t reductions_after_block(int64_t layer) const;
  // Stages 1-3: every parameter (in registration order) with the range of its flattened elements
  // this rank owns (begin == end: none), and its shape.
  std::vector<std::pair<std::string, OptimizerRange>> owned_ranges() const;
  void build_buckets(double bucket_mb);
  // Stages 1-3; with `initial` (stage 3, a meta model) each unit is filled and released in turn.
  void build_units(const InitialValues* initial);
  void build_optimizer(const OptimOptions& optim, bool offload_to_host);
  void register_hooks();

  void grad_ready(size_t param);
  void launch_through(size_t end);
  void launch(const Reduction& r);
  void drain_scatters(size_t keep);
  void collect(PendingScatter& pending);
  // Stages 2-3: the unit's summed shard divided by its group's size (and copied to the host with
  // offload, unless it holds tp shares: after their sum), once per step.
  void finalize(size_t unit);
  // Tensor parallelism's shares (gradient_shares.h): whether a unit or bucket holds one, and
  // their sums (then, with offload, their buckets' or units' copies to the host).
  bool holds_shares(const FlatUnit& unit) const;
  bool bucket_holds_shares(size_t bucket) const;
  void sum_shares();
  // Stage 0 with a compressor: averages bucket b with it, on dp's communication thread (run_async).
  void compress(size_t bucket);

  // Stage 3: every unit of `part` held and whole, and dropped.
  void hold_part(size_t part);
  void drop_part(size_t part);
  // Stage 3 during the probe: the block wrapper's run, and a block's backward beginning.
  BlockOutput probe_block(int64_t layer, const at::Tensor& x, const TransformerLMImpl::BlockCall& inner);
  void probe_block_backward(int64_t layer);
  // Stage 3.
  BlockOutput run_block(int64_t layer, const at::Tensor& x, const TransformerLMImpl::BlockCall& inner);
  void around_end(const ModelPart& part, const std::function<void()>& inner);
  void before_block_backward(int64_t layer);
};

}  // namespace tessera
