// The data-parallel side of a priced layout (priced_layout.h): the reduction over the replicas,
// tensor parallelism's gradient shares, ZeRO's gathers, offload and the optimizer step.
#include "plan/priced_layout.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace tessera::plan {

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
  // Tensor parallelism's gradient shares (parallel/tensor/gradient_shares.h): one all-reduce of
  // their float32 concatenation a step over each group, after the reduction (this rank's shards of
  // them at stages 2-3), hiding behind nothing: over tp, and over the consecutive tp ranks holding
  // the same key/value heads (tp / n_kv_head of them).
  const std::vector<int64_t> tp_group = dims.group_of("tp", 0);
  const double sharded = p.zero_stage >= 2 ? static_cast<double>(n_replicas) : 1.0;
  if (out.held.tp_shares > 0)
    out.tp_gradient_sum = all_reduce_seconds(4 * out.held.tp_shares / sharded, dims.tp(), cluster.tier(tp_group));
  if (out.held.kv_shares > 0) {
    const int64_t kv_replicas = dims.tp() / config.model.kv_heads();
    const std::vector<int64_t> kv_group(tp_group.begin(), tp_group.begin() + kv_replicas);
    out.tp_gradient_sum += all_reduce_seconds(4 * out.held.kv_shares / sharded, kv_replicas, cluster.tier(kv_group));
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

}  // namespace tessera::plan
