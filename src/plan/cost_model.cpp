// The planner's cost model (cost_model.h).
#include "plan/cost_model.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "core/error.h"
#include "model/model_size.h"
#include "model/operations.h"
#include "parallel/pipeline/schedule_builders.h"
#include "parallel/pipeline/simulate.h"
#include "parallel/pipeline/validate.h"
#include "plan/layout.h"
#include "plan/memory_estimate.h"
#include "plan/stage_cut.h"
#include "plan/swap_cost.h"

namespace tessera::plan {
namespace {

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
  double tp_gradient_sum = 0;        // the tp shares' one all-reduce a step (in OPTIM under a pipeline)
  double step_without_pipeline = 0;  // pp = 1: the whole step
  // memory.resident_micro_batches: per pipeline rank, its held micro-batches' copies a step (in its I's)
  std::vector<double> held_copies;
};

// On a CPU "device" whose every core computes (a rank per core), a collective's copying and
// summing, a pipeline send and a host copy take a core from the compute beside them: no compute
// hides them (bench/plan_runs_here.py: the two-rank rows were under-predicted, docs/plan.md).
bool every_core_computes(const Cluster& cluster, const ParallelDims& dims) {
  return cluster.device.kind == "cpu" && dims.world_size() >= cluster.cluster.devices_per_node;
}

// What a layout's prices are before its ZeRO stage, offload and swap: one micro-batch of every
// part, and with a pipeline the cut, the placement, the stages' costs and the transfer; the weights
// of the rank that holds the most.
PricedLayout price_compute(const Config& config, const ParallelDims& dims, const Cluster& cluster,
                           const PricedOperations& priced, PlanCache* cache) {
  const ModelOptions& model = config.model;
  const ParallelOptions& p = config.parallel;
  const OperationShape& shape = priced.shape;
  PricedLayout out;
  out.m = config.train.accumulation(dims.dp());
  out.memory_slowdown = priced.memory_slowdown;
  out.all = priced.total();

  // Without a pipeline every rank holds every block; with one, the stages of each pipeline rank
  // (the cut and the placement below), the largest rank's weights.
  const double tied_copy = model.tie_embeddings ? static_cast<double>(model.n_embd) *
                                                      static_cast<double>(model.padded_vocab()) /
                                                      static_cast<double>(dims.tp())
                                                : 0;
  out.held = out.all;
  out.blocks = model.n_layer;
  if (dims.pp() > 1) {
    BlockCosts blocks;
    for (const PartCost& c : priced.blocks) {
      blocks.block_seconds.push_back(c.f + c.i + c.w);
      blocks.block_activation_bytes.push_back(0);
      blocks.block_split.push_back({c.f, c.i + c.w, c.i, c.w});
    }
    const PartCost& embedding = priced.embedding;
    const PartCost& head = priced.head;
    blocks.embedding_seconds = embedding.f + embedding.i + embedding.w;
    blocks.head_seconds = head.f + head.i + head.w;
    blocks.embedding_split = {embedding.f, embedding.i + embedding.w, embedding.i, embedding.w};
    blocks.head_split = {head.f, head.i + head.w, head.i, head.w};
    out.cut = cache ? cache->cut(config, dims) : pipeline_cut(config, dims);
    add_measured_costs(*out.cut, blocks);
    out.costs.stages = out.cut->compute;
    // The model prices a whole backward as exactly its two halves; summed per stage in another
    // order they could differ in the last bit, and a B "cheaper" by rounding would make the
    // builders try whole backwards (schedule_builders.h) for nothing.
    for (pipeline::ActionCosts::Compute& stage : out.costs.stages) stage.b = stage.i + stage.w;
    const std::vector<int64_t> pp_group = dims.group_of("pp", 0);
    const Cluster::Tier pp_tier = cluster.tier({pp_group[0], pp_group[1]});
    const double transfer_tokens = shape.tokens() / (p.megatron_sp ? static_cast<double>(dims.tp()) : 1.0);
    const double transfer_bytes = transfer_tokens * static_cast<double>(model.n_embd) *
                                  (p.pp_transfer_dtype == "float32" ? 4 : static_cast<double>(shape.element_bytes));
    out.costs.transfer = send_seconds(transfer_bytes, pp_tier);
    // With no core to spare a send's copying takes the sender's core (its bytes' time; the
    // receiver's wait is the transfer's delay).
    const double copying = every_core_computes(cluster, dims) ? transfer_bytes / pp_tier.bandwidth_bytes_per_s : 0;
    out.placement.pp = dims.pp();
    out.placement.v = p.pipeline_virtual();
    out.placement.placement = pipeline::placement_of(p.pp_schedule);
    // Each stage boundary between two ranks is one send out of each of them per micro-batch (the
    // activations one way, their gradients back), through each rank's own link.
    std::vector<int64_t> crossings(static_cast<size_t>(dims.pp()), 0);
    for (int64_t st = 0; st + 1 < out.cut->stages(); ++st) {
      const int64_t a = out.placement.rank_of(st), b = out.placement.rank_of(st + 1);
      if (a == b) continue;
      out.link_crossings = std::max({out.link_crossings, ++crossings[static_cast<size_t>(a)], ++crossings[static_cast<size_t>(b)]});
      // The sender's F (the activations on) and the next stage's I (their gradients back).
      out.costs.stages[static_cast<size_t>(st)].f += copying;
      pipeline::ActionCosts::Compute& next = out.costs.stages[static_cast<size_t>(st + 1)];
      next.i += copying;
      next.b = next.i + next.w;
    }
    // memory.resident_micro_batches: a stage's I pays its blocks' copies for the share of its
    // forwards that its rank's row offloads (pipeline::held_offloaded_forwards, on the table these
    // costs build before the copies are added).
    if (config.memory.resident_micro_batches > 0) {
      const std::vector<int64_t> offloaded = pipeline::held_offloaded_by_stage(
          cache ? cache->table(p, dims.pp(), out.m, out.costs)
                : pipeline::build_schedule(p.pp_schedule, dims.pp(), out.m, p.pipeline_virtual(), out.costs),
          config.memory.resident_micro_batches);
      out.held_copies.assign(static_cast<size_t>(dims.pp()), 0);
      for (int64_t st = 0; st < out.cut->stages(); ++st) {
        double copies = 0;
        for (int64_t b = out.cut->boundaries[st]; b < out.cut->boundaries[st + 1]; ++b)
          copies += priced.blocks[b].held_offload * static_cast<double>(offloaded[static_cast<size_t>(st)]);
        pipeline::ActionCosts::Compute& stage = out.costs.stages[static_cast<size_t>(st)];
        stage.i += copies / static_cast<double>(out.m);
        stage.b = stage.i + stage.w;
        out.held_copies[static_cast<size_t>(out.placement.rank_of(st))] += copies;
      }
    }
    out.held = PartCost{};
    for (int64_t rank = 0; rank < dims.pp(); ++rank) {
      PartCost held;
      int64_t blocks = 0;
      for (int64_t s = 0; s < out.cut->stages(); ++s) {
        if (out.placement.rank_of(s) != rank) continue;
        for (int64_t b = out.cut->boundaries[s]; b < out.cut->boundaries[s + 1]; ++b) {
          const PartCost& block = priced.blocks[b];
          held.parameters += block.parameters, held.expert_parameters += block.expert_parameters;
          held.lowrank += block.lowrank, held.compress += block.compress, held.tp_shares += block.tp_shares;
        }
        blocks += out.cut->boundaries[s + 1] - out.cut->boundaries[s];
        if (s == 0) held += embedding;
        if (s == out.cut->stages() - 1) {
          held += head;
          held.parameters += tied_copy, held.lowrank += tied_copy;  // the tied head's copy travels whole
        }
      }
      if (held.parameters > out.held.parameters) out.blocks = blocks, out.held = held;
    }
  }
  return out;
}

// `out` (price_compute's) completed by the data-parallel side of `config`'s layout: the gradient
// reduction, ZeRO's gathers, offload and the optimizer step, and the step without a pipeline.
PricedLayout with_data_parallel(PricedLayout out, const Config& config, const ParallelDims& dims, const Cluster& cluster) {
  const ParallelOptions& p = config.parallel;
  const int64_t m = out.m;
  const double params = out.held.parameters;
  // The routed experts' weights reduce and shard over their own replicas (the edp group: dp / ep
  // of them; parallel/data/data_parallel.h), the rest over the data replicas.
  const double expert_params = out.held.expert_parameters, dense_params = params - expert_params;

  // The gradient reduction over the data replicas, and ZeRO's parameter gathers.
  const std::vector<int64_t> replicas = dims.group_of(replica_group_name(dims), 0);
  const int64_t n_replicas = static_cast<int64_t>(replicas.size());
  const Cluster::Tier replica_tier = cluster.tier(replicas);
  const std::vector<int64_t> expert_replicas = dims.group_of(dims.sp() > 1 ? "edp_sp" : "edp", 0);
  const int64_t n_expert_replicas = static_cast<int64_t>(expert_replicas.size());
  const Cluster::Tier expert_tier = cluster.tier(expert_replicas);
  const double grad_bytes =
      (p.grad_compression == "bf16" || p.grad_compression == "fp16" || config.precision.dtype == "fp16") ? 2 : 4;
  const double param_bytes = config.precision.dtype == "fp16" ? 2 : 4;
  // The reduction runs one collective per bucket of parallel.bucket_mb, ZeRO-3's gathers one per
  // block (and one for the ends): each collective beyond the first pays its latency steps again
  // ((n - 1) per all-gather or reduce-scatter; an all-reduce its tree's), which at hundreds of
  // replicas is most of its time.
  const double gather_latency = all_gather_seconds(0, n_replicas, replica_tier);  // a collective's latency alone
  const auto buckets_beyond_first = [&](double weights) {
    return std::max(0.0, std::ceil(weights * grad_bytes / (p.bucket_mb * 1e6)) - 1);
  };
  const double more_buckets = buckets_beyond_first(params);
  // The plain reduction and ZeRO's collectives of `weights` elements over `n` replicas on `tier`,
  // with the latency of each bucket beyond the first (the experts' beside the rest: each group's
  // own collectives and buckets, one after the other).
  const auto reduce_scatter = [&](double weights, int64_t n, const Cluster::Tier& tier) {
    return weights > 0 ? all_gather_seconds(weights * grad_bytes, n, tier) +
                             buckets_beyond_first(weights) * all_gather_seconds(0, n, tier)
                       : 0.0;
  };
  const auto all_reduce = [&](double weights, int64_t n, const Cluster::Tier& tier) {
    return weights > 0 ? all_reduce_seconds(weights * grad_bytes, n, tier) +
                             buckets_beyond_first(weights) * all_reduce_seconds(0, n, tier)
                       : 0.0;
  };
  const auto gather = [&](double weights, int64_t n, const Cluster::Tier& tier) {
    return weights > 0 ? all_gather_seconds(weights * param_bytes, n, tier) : 0.0;
  };
  double reduce_per_step = 0, reduce_per_micro_batch = 0, gather_per_pass = 0;
  // Stages 0-1 all-reduce per step, or reduce through a compressor (optim/compression/, priced in
  // its steady state after its start steps): PowerSGD's two all-reduces of the float32 factors (and
  // the tensors sent whole), top-k's all-gather of (index, value) pairs while the replicas' pairs
  // are fewer than the entries (else the all-reduce), each with its compressor's own work
  // (PartCost::compress); overlapped with the backward as the plain reduction is. Stages 2-3
  // reduce-scatter every micro-batch. (The compressors refuse expert parallelism.)
  if (p.zero_stage >= 2) {
    reduce_per_micro_batch =
        reduce_scatter(dense_params, n_replicas, replica_tier) + reduce_scatter(expert_params, n_expert_replicas, expert_tier);
  } else if (n_replicas > 1 && p.grad_compression == "powersgd") {
    reduce_per_step = all_reduce_seconds(4 * out.held.lowrank, n_replicas, replica_tier) +
                      (2 * more_buckets + 1) * all_reduce_seconds(0, n_replicas, replica_tier) + out.held.compress;
  } else if (n_replicas > 1 && p.grad_compression == "topk") {
    const double k = std::ceil(p.topk_ratio * params);
    reduce_per_step = (static_cast<double>(n_replicas) * k < params
                           ? all_gather_seconds(static_cast<double>(n_replicas) * 8 * k, n_replicas, replica_tier) +
                                 more_buckets * gather_latency
                           : all_reduce_seconds(4 * params, n_replicas, replica_tier)) +
                      out.held.compress;
  } else if (n_replicas > 1) {
    reduce_per_step =
        all_reduce(dense_params, n_replicas, replica_tier) + all_reduce(expert_params, n_expert_replicas, expert_tier);
  }
  // ZeRO-1 and 2: each replica updates its shard, then the parameters are gathered: after the
  // step, overlapping nothing.
  const double gather_after_step =
      (p.zero_stage == 1 || p.zero_stage == 2)
          ? gather(dense_params, n_replicas, replica_tier) + gather(expert_params, n_expert_replicas, expert_tier)
          : 0;
  if (p.zero_stage == 3)
    gather_per_pass = gather(dense_params, n_replicas, replica_tier) +
                      gather(expert_params, n_expert_replicas, expert_tier) +
                      static_cast<double>(out.blocks) * gather_latency;
  // The parameters of this rank's shard (all of them without ZeRO).
  const double shard_params =
      p.zero_stage >= 1 ? dense_params / static_cast<double>(n_replicas) +
                              expert_params / static_cast<double>(n_expert_replicas)
                        : params;
  // The step over this rank's shard, and the clipping norm over the gradients it holds (all of
  // them at stages 0-1, its shard at 2-3). On a CPU "device" the step runs on the host's memory,
  // as offload's and swap's host step do, so at the rate the file measured for it
  // (host.optimizer_gbs, AdamW's fused step under core sharing); elsewhere at the device's
  // streaming rate.
  const bool host_step = cluster.device.kind == "cpu" && cluster.host.optimizer_gbs > 0;
  const double bandwidth =
      host_step ? 1e9 * cluster.host.optimizer_gbs : 1e9 * cluster.device.memory_gbs / out.memory_slowdown;
  const double grads_held = p.zero_stage >= 2 ? shard_params : params;
  out.optimizer = shard_params * optimizer_bytes_per_element(config) / bandwidth + grads_held * grad_bytes / bandwidth;
  // ZeRO-Offload (memory/offload/offload.h): the shard's float32 gradient goes to the host (stage
  // 1 after the reduction; stages 2-3 block by block during the last backward), the host steps
  // (and takes the clipping norm over its shard), the masters come back before the gather.
  double offload_to_host = 0, offload_to_device = 0;
  if (p.offload) {
    require(cluster.host.optimizer_gbs > 0 && cluster.host.device_link_gbs > 0, cluster.source,
            ": parallel.offload needs host.optimizer_gbs and host.device_link_gbs, which this cluster file leaves at 0");
    const double host_rate = 1e9 * cluster.host.optimizer_gbs, link = 1e9 * cluster.host.device_link_gbs;
    out.optimizer = shard_params * (optimizer_bytes_per_element(config) + 4) / host_rate;
    offload_to_host = shard_params * 4 / link;
    offload_to_device = shard_params * param_bytes / link;
  }
  // Tensor parallelism's gradient shares (parallel/tensor/gradient_shares.h): one all-reduce over
  // tp of their float32 concatenation a step, after the reduction (this rank's shards of them at
  // stages 2-3), hiding behind nothing.
  if (out.held.tp_shares > 0) {
    const std::vector<int64_t> tp_group = dims.group_of("tp", 0);
    const double elements = p.zero_stage >= 2 ? out.held.tp_shares / static_cast<double>(n_replicas) : out.held.tp_shares;
    out.tp_gradient_sum = all_reduce_seconds(4 * elements, static_cast<int64_t>(tp_group.size()), cluster.tier(tp_group));
  }
  // The reduction's last bucket, which no backward hides (none without data replicas). Where
  // every core computes nothing hides (`hides` 0): the whole reduction is exposed already, its
  // last bucket with it.
  const double hides = every_core_computes(cluster, dims) ? 0 : 1;
  const double reduced = (n_replicas > 1 ? dense_params : 0) + (n_expert_replicas > 1 ? expert_params : 0);
  const double bucket = n_replicas > 1 ? hides * std::min(p.bucket_mb * 1e6, reduced * grad_bytes) /
                                             replica_tier.bandwidth_bytes_per_s
                                       : 0;
  // The host copy's exposed part: all of it at stage 1; at stages 2-3 what the backward beside it
  // does not hide, and the last block's.
  auto offload_exposed = [&](double compute) {
    const double backward = hides * compute;
    if (!p.offload) return 0.0;
    const double to_host = p.zero_stage >= 2 ? std::max(0.0, offload_to_host - backward) +
                                                   offload_to_host / static_cast<double>(out.blocks + 1)
                                             : offload_to_host;
    return to_host + offload_to_device;
  };

  if (dims.pp() == 1) {
    const double forward = out.all.f, backward = out.all.i + out.all.w;
    // The bucketed reduction runs beside the last micro-batch's backward (every micro-batch's
    // under ZeRO-2/3); its last bucket only after it.
    if (reduce_per_micro_batch > 0)
      out.reduce_exposed =
          static_cast<double>(m) * (std::max(0.0, reduce_per_micro_batch - hides * backward) + bucket);
    out.reduce_exposed +=
        (reduce_per_step > 0 ? std::max(0.0, reduce_per_step - hides * backward) + bucket : 0) + gather_after_step;
    if (gather_per_pass > 0) {
      const double one_block = gather_per_pass / static_cast<double>(out.blocks + 1);
      out.gather_exposed = static_cast<double>(m) * (std::max(0.0, gather_per_pass - hides * forward) +
                                                     std::max(0.0, gather_per_pass - hides * backward) + 2 * one_block);
    }
    out.offload = offload_exposed(backward);
    out.step_without_pipeline = static_cast<double>(m) * (forward + backward) + out.reduce_exposed +
                                out.gather_exposed + out.tp_gradient_sum + out.offload + out.optimizer;
  } else {
    out.gathers = layout_gathers(p, dims) != pipeline::Gathers::none;
    out.costs.gather = gather_per_pass / static_cast<double>(out.placement.v);
    // The reduction overlaps the rank's last backward of each stage; what is left, and the
    // optimizer step, is the OPTIM action.
    double last_backward = 0;
    for (const auto& stage : out.cut->compute) last_backward = std::max(last_backward, stage.i + stage.w);
    out.reduce_exposed = std::max(0.0, reduce_per_step - hides * last_backward) +
                         static_cast<double>(m) * std::max(0.0, reduce_per_micro_batch - hides * last_backward) +
                         bucket + gather_after_step;
    out.offload = offload_exposed(last_backward);
    out.costs.optim = out.reduce_exposed + out.tp_gradient_sum + out.offload + out.optimizer;
  }
  return out;
}

// The busiest rank link's sends in one step: per micro-batch one each way for every stage boundary
// the rank sits on (a middle rank of a pipeline sends activations on and gradients back, and
// receives both, through its one link).
double link_seconds(const PricedLayout& layout) {
  return static_cast<double>(layout.link_crossings * layout.m) * layout.costs.transfer;
}

// step_lower_bound's with a pipeline (cost_model.h lists its terms).
double pipeline_lower_bound(const Config& config, const PricedLayout& layout) {
  const std::string& name = config.parallel.pp_schedule;
  const std::vector<pipeline::ActionCosts::Compute>& stage = layout.costs.stages;
  const int64_t stages = static_cast<int64_t>(stage.size());
  const pipeline::Schedule& at = layout.placement;
  const double m = static_cast<double>(layout.m), p = static_cast<double>(at.pp);
  const bool split = name == "zbh1" || name == "zbv" || name == "dualpipev";
  const double start = layout.gathers ? layout.costs.gather : 0;
  std::vector<double> head(static_cast<size_t>(at.pp), 1e300), work(static_cast<size_t>(at.pp), 0);
  double forward_chain = start, backward_chain = 0, largest_f = 0, largest_back = 0, total = 0;
  for (int64_t s = 0; s < stages; ++s) {
    const double cross = s + 1 < stages && at.rank_of(s) != at.rank_of(s + 1) ? layout.costs.transfer : 0;
    const double back = split ? stage[s].i : stage[s].b;
    const int64_t r = at.rank_of(s);
    head[r] = std::min(head[r], forward_chain);
    work[r] += m * (stage[s].f + stage[s].b);
    forward_chain += stage[s].f + cross;
    backward_chain += back + cross;
    largest_f = std::max(largest_f, stage[s].f);
    largest_back = std::max(largest_back, back);
    total += stage[s].f + stage[s].b;
  }
  double bound = forward_chain + backward_chain + (split ? stage[0].w : 0) + (m - 1) * std::max(largest_f, largest_back);
  for (int64_t r = 0; r < at.pp; ++r) bound = std::max(bound, head[r] + work[r]);
  if (name == "1f1b" || name == "gpipe") bound = std::max(bound, total * (m + p - 1) / p);
  return std::max(bound, link_seconds(layout)) + layout.costs.optim;
}

PricedLayout price_layout(const Config& config, const ParallelDims& dims, const Cluster& cluster,
                          const PricedOperations& priced, PlanCache* cache) {
  return with_data_parallel(price_compute(config, dims, cluster, priced, cache), config, dims, cluster);
}

double bound_of(const Config& config, const ParallelDims& dims, const PricedLayout& layout) {
  // A swapped step's compute stream runs every forward and backward; the host's work may hide.
  if (config.memory.swap) return static_cast<double>(layout.m) * (layout.all.f + layout.all.i + layout.all.w);
  return dims.pp() == 1 ? layout.step_without_pipeline : pipeline_lower_bound(config, layout);
}

}  // namespace

double step_lower_bound(const Config& config, const ParallelDims& dims, const Cluster& cluster,
                        const PricedOperations& priced, PlanCache* cache) {
  return bound_of(config, dims, price_layout(config, dims, cluster, priced, cache));
}

std::vector<double> step_lower_bounds(const std::vector<Config>& variants, const ParallelDims& dims,
                                      const Cluster& cluster, const PricedOperations& priced, PlanCache* cache) {
  std::vector<double> out;
  if (variants.empty()) return out;
  const PricedLayout compute = price_compute(variants.front(), dims, cluster, priced, cache);
  for (const Config& v : variants) out.push_back(bound_of(v, dims, with_data_parallel(compute, v, dims, cluster)));
  return out;
}

const StageCut& PlanCache::cut(const Config& config, const ParallelDims& dims) {
  const std::pair<int64_t, int64_t> key{dims.pp(), config.parallel.pipeline_virtual()};
  auto it = cuts_.find(key);
  if (it == cuts_.end()) it = cuts_.emplace(key, pipeline_cut(config, dims)).first;
  return it->second;
}

Layout PlanCache::layout(const Config& config, const ParallelDims& dims) {
  if (dims.pp() == 1) return make_layout(config, dims);
  const ParallelOptions& p = config.parallel;
  const ShapeKey key{dims.pp(), p.pipeline_virtual(), p.pp_schedule, config.train.accumulation(dims.dp()),
                     layout_gathers(p, dims)};
  auto it = layouts_.find(key);
  if (it == layouts_.end()) it = layouts_.emplace(key, make_layout(config, dims)).first;
  return Layout(dims, it->second.cut(), it->second.schedule(), std::nullopt);
}

const pipeline::Schedule& PlanCache::table(const ParallelOptions& parallel, int64_t pp, int64_t micro_batches,
                                            const pipeline::ActionCosts& costs) {
  std::vector<double> built_from = {costs.transfer};
  for (const pipeline::ActionCosts::Compute& c : costs.stages) built_from.insert(built_from.end(), {c.f, c.b, c.i, c.w});
  auto key = std::make_tuple(parallel.pp_schedule, pp, parallel.pipeline_virtual(), micro_batches, std::move(built_from));
  auto it = tables_.find(key);
  if (it == tables_.end())
    it = tables_.emplace(std::move(key), pipeline::build_schedule(parallel.pp_schedule, pp, micro_batches,
                                                                  parallel.pipeline_virtual(), costs)).first;
  return it->second;
}

Prediction predict_time(const Config& config, const ParallelDims& dims, const Cluster& cluster,
                        const CostOptions& options, const PricedOperations* shared, PlanCache* cache) {
  check_modelled(config);
  const ModelOptions& model = config.model;
  const ParallelOptions& p = config.parallel;
  const PricedOperations own = shared ? PricedOperations{} : price_operations(config, dims, cluster, options);
  const PricedOperations& priced = shared ? *shared : own;
  const PricedLayout layout = price_layout(config, dims, cluster, priced, cache);
  const int64_t m = layout.m;

  Prediction out;
  out.micro_batches = m;
  PartCost rank_total;  // one micro-batch of the critical rank's parts
  double bubble = 0, swapping = 0, held_copies = 0;
  double reduce = layout.reduce_exposed, gathers = layout.gather_exposed, offload = layout.offload,
         optimizer = layout.optimizer, tp_gradient_sum = layout.tp_gradient_sum;
  if (config.memory.swap) {
    // The swap engine's replay: its loads, stores and host updates beyond the compute stream's
    // work are the swap term (the host's updates among them).
    const SwapStep swapped = predict_swap_step(config, dims, cluster, priced);
    rank_total = layout.all;
    // memory.activation_policy = auto: the policy chosen with the plan, its seconds in the plan's
    // backwards.
    if (swapped.activation_policy)
      for (const ActivationOption& o : swapped.activation_policy->blocks) rank_total.activation_policy += o.seconds;
    out.step_s = swapped.step_s;
    reduce = swapped.reduce_s, gathers = 0, offload = 0, optimizer = 0;
    swapping = swapped.step_s - swapped.reduce_s -
               static_cast<double>(m) * (layout.all.f + layout.all.i + layout.all.w + rank_total.activation_policy);
  } else if (dims.pp() == 1) {
    rank_total = layout.all;
    out.step_s = layout.step_without_pipeline;
  } else {
    // The table for these costs (as a run rebuilds zbv's and zbh1's for its measured ones), with
    // this layout's parameter actions (the table as schedule_for_options makes it; the planner
    // refuses file: schedules).
    pipeline::Schedule schedule = cache ? cache->table(p, dims.pp(), m, layout.costs)
                                         : pipeline::build_schedule(p.pp_schedule, dims.pp(), m,
                                                                    p.pipeline_virtual(), layout.costs);
    pipeline::add_parameter_actions(schedule, layout_gathers(p, dims));
    pipeline::validate_schedule(schedule);
    const pipeline::Simulation sim = pipeline::simulate_schedule(schedule, layout.costs, pipeline::Timeline::skip);
    require(sim.stuck.empty(), "internal: the planner's pipeline table did not run to its end");
    // The simulator takes a transfer as a delay; the link between two ranks carries its sends one
    // after another, which the step cannot beat on a slow link.
    out.step_s = std::max(sim.step_time, link_seconds(layout) + layout.costs.optim);
    const int64_t critical = std::max_element(sim.busy.begin(), sim.busy.end()) - sim.busy.begin();
    const StageCut& cut = *layout.cut;
    for (int64_t s = 0; s < cut.stages(); ++s) {
      if (schedule.rank_of(s) != critical) continue;
      for (int64_t b = cut.boundaries[s]; b < cut.boundaries[s + 1]; ++b) rank_total += priced.blocks[b];
      if (s == 0) rank_total += priced.embedding;
      if (s == cut.stages() - 1) rank_total += priced.head;
    }
    if (!layout.held_copies.empty()) held_copies = layout.held_copies[static_cast<size_t>(critical)];
    bubble = out.step_s - sim.busy[critical] - layout.costs.optim;
  }
  const double mb = static_cast<double>(m);
  out.breakdown = {{"products", mb * rank_total.products},
                   {"attention", mb * rank_total.attention},
                   {"memory_bound", mb * rank_total.memory_bound},
                   {"recompute", mb * rank_total.recompute},
                   {"activation_offload_copies", mb * rank_total.offload + held_copies},
                   {"activation_policy", mb * rank_total.activation_policy},
                   {"tp_communication", mb * rank_total.tp},
                   {"tp_gradient_sum", tp_gradient_sum},
                   {"sp_communication", mb * rank_total.sp},
                   {"ep_communication", mb * rank_total.ep},
                   {"pipeline_bubble_and_transfers", bubble},
                   {"zero3_gathers_exposed", gathers},
                   {"dp_reduction_exposed", reduce},
                   {"offload_copies", offload},
                   {"swap_link_and_host", swapping},
                   {"optimizer", optimizer}};
  const double tokens = static_cast<double>(config.train.batch_size * config.train.seq_len) * mb *
                        static_cast<double>(dims.dp());
  out.tokens_per_s = tokens / out.step_s;
  out.model_flops_per_step = flops_per_token(model, config.train.seq_len) * tokens;
  const double peak = 1e12 * cluster.device.peak_tflops(config.precision.dtype != "fp32");
  out.mfu = out.model_flops_per_step / (out.step_s * static_cast<double>(dims.world_size()) * peak);
  return out;
}

Prediction predict(const Config& config, const ParallelDims& dims, const Cluster& cluster, const CostOptions& options) {
  Prediction prediction = predict_time(config, dims, cluster, options);
  add_memory(prediction, config, dims, cluster);
  return prediction;
}

}  // namespace tessera::plan
