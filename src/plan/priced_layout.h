// What the cost model (cost_model.cpp) and its data-parallel side (data_parallel_cost.cpp) share:
// a layout priced up to its step. Internal to src/plan.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "config/config.h"
#include "core/parallel_dims.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/simulate.h"
#include "plan/cluster.h"
#include "plan/cost_model.h"
#include "plan/stage_cut.h"

namespace tessera::plan {

// A layout priced up to its step, before any table is built: what the prediction and the lower
// bound share.
struct PricedLayout {
  int64_t m = 1;                    // micro-batches per step
  PartCost all;                     // one micro-batch of every block and both ends
  // With a pipeline: the cut, which rank holds each stage (a table's shape, no actions), and the
  // table's costs: per stage F, B = I + W, I, W, the transfer, one GATHER's fetch and OPTIM (the
  // reduction's exposed part and the optimizer step).
  std::optional<StageCut> cut;
  pipeline::Schedule placement;
  pipeline::ActionCosts costs;
  bool gathers = false;             // the table has ZeRO-3's GATHER actions
  int64_t blocks = 0;               // the blocks of the rank that holds the most weights
  PartCost held;                    // that rank's weights, gradient compression and tp shares (those fields only)
  double memory_slowdown = 1;       // the memory-bound kernels' slowdown of the prices (PricedOperations')
  int64_t link_crossings = 0;       // stage boundaries the busiest rank sits on
  double reduce_exposed = 0, gather_exposed = 0, offload = 0, optimizer = 0;
  double tp_gradient_sum = 0;        // the tp shares' sums a step (in OPTIM under a pipeline)
  double step_without_pipeline = 0;  // pp = 1: the whole step
  // memory.resident_micro_batches: per pipeline rank, its held micro-batches' copies a step (in its I's)
  std::vector<double> held_copies;
};

// On a CPU "device" whose every core computes (a rank per core), a collective's copying and
// summing, a pipeline send and a host copy take a core from the compute beside them: no compute
// hides them (bench/plan_runs_here.py: the two-rank rows were under-predicted, docs/plan.md).
inline bool every_core_computes(const Cluster& cluster, const ParallelDims& dims) {
  return cluster.device.kind == "cpu" && dims.world_size() >= cluster.cluster.devices_per_node;
}

// `out` (cost_model.cpp's price_compute) completed by the data-parallel side of `config`'s
// layout: the gradient reduction, tensor parallelism's gradient shares, ZeRO's gathers, offload
// and the optimizer step, and the step without a pipeline.
PricedLayout with_data_parallel(PricedLayout out, const Config& config, const ParallelDims& dims, const Cluster& cluster);

}  // namespace tessera::plan
