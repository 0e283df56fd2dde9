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
// - Stage 3: `residency` runs the ZeRO-3 plan (memory/residency/residency_plan.h) over `units`:
//   a unit (a block's, or the ends') is materialized only between its fetch and its release.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

#include "comm/group.h"
#include "optim/compression/compressor.h"
#include "optim/optimizer.h"
#include "parallel/data/data_parallel.h"
#include "memory/residency/flat_unit.h"
#include "memory/offload/offload.h"
#include "memory/residency/residency.h"

namespace tessera {

struct DataParallel::Impl {
  struct Bucket {
    std::vector<size_t> params;  // indices into `params`
    at::Tensor grad;             // [sum of numel]: the parameters' .grad are views of it
    comm::Work work;
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
  comm::Group& dp;
  int64_t stage, world, rank, n_blocks;
  NamedParams params;  // the model's, in registration order
  std::unique_ptr<Optimizer> optimizer;
  std::unique_ptr<GradientCompressor> compressor;
  std::unique_ptr<OffloadedShard> offload;  // parallel.offload
  ModelParallelNorm norm;                    // tensor parallelism's weights in the clipping norm
  int64_t block_wrapper = -1, end_wrapper = -1;  // stage 3: the model's wrapper ids

  std::vector<Bucket> buckets;          // stages 0-1
  std::vector<at::Tensor> grad_views;   // stages 0-1: per parameter, its .grad (a view of its bucket)
  std::vector<FlatUnit> units;          // stages 1-3: blocks 0..n_blocks-1, then the rest
  std::vector<at::Tensor> grad_shards;  // stages 2-3: per unit, [S]
  std::unique_ptr<Residency> residency;  // stage 3

  std::vector<Reduction> reductions;  // in launch order
  std::vector<size_t> reduction_of;   // per parameter
  std::vector<char> arrived;          // per parameter, in this backward
  size_t next_launch = 0;
  bool armed = false;     // before_backward was called and finish_gradients not yet
  bool reducing = false;  // this backward's gradients are reduced
  bool last_micro_batch = false;
  std::deque<PendingScatter> scatters;

  Impl(TransformerLM m, comm::Group& group, const ParallelOptions& parallel)
      : model(std::move(m)),
        dp(group),
        stage(parallel.zero_stage),
        world(group.size()),
        rank(group.rank()),
        n_blocks(model->options().n_layer) {}

  void build_buckets(double bucket_mb);
  void build_units();
  void build_optimizer(const OptimOptions& optim, bool offload_to_host);
  void register_hooks();

  void grad_ready(size_t param);
  void launch_through(size_t end);
  void launch(const Reduction& r);
  void drain_scatters(size_t keep);
  void collect(PendingScatter& pending);
  // Stage 0 with a compressor: averages bucket b with it, on dp's communication thread (run_async).
  void compress(size_t bucket);

  // Stage 3.
  BlockOutput run_block(int64_t layer, const at::Tensor& x, const TransformerLMImpl::BlockCall& inner);
  void around_end(const ModelPart& part, const std::function<void()>& inner);
  void before_block_backward(int64_t layer);
};

}  // namespace tessera
