// An ATOM swarm's predicted step (swarm_cost.h).
#include "plan/swarm_cost.h"

#include <algorithm>

#include "core/error.h"
#include "core/parallel_dims.h"
#include "model/model_size.h"

namespace tessera::plan {

Config peer_config(const Config& config, int64_t peers) {
  Config c = config;
  ParallelOptions& p = c.parallel;
  p.dp = 1, p.tp = 1, p.pp = 1, p.sp = 1, p.ep = 1, p.zero_stage = 0, p.offload = false, p.megatron_sp = false;
  p.pp_virtual = 0;
  if (config.swarm.sync == "batch") {
    require(config.swarm.target_batch_size % (peers * config.train.batch_size) == 0, "swarm.target_batch_size = ",
            config.swarm.target_batch_size, " is not a multiple of ", peers, " peers x train.batch_size = ",
            config.train.batch_size, ": the planner prices equal shares");
    c.train.global_batch_size = config.swarm.target_batch_size / peers;
    c.train.grad_accum = 1;
  }
  return c;
}

bool rounds_overlap(const Config& config) {
  return config.swarm.sync == "batch" && config.swarm.overlap_rounds == "always" && !config.memory.swap &&
         config.precision.dtype != "fp16";
}

double swarm_round_seconds(double bytes, int64_t peers, const Cluster& cluster, int64_t steps) {
  if (peers <= 1) return 0;
  const Cluster::Tier link = cluster.peer_tier();
  const double n = static_cast<double>(peers);
  return 2 * (n - 1) / n * bytes / link.bandwidth_bytes_per_s + static_cast<double>(steps) * link.latency_s +
         1e-3 * cluster.peers.round_overhead_ms;
}

RoundCpu round_cpu(double bytes, int64_t peers, const Cluster& cluster) {
  if (peers <= 1) return {};
  const double n = static_cast<double>(peers);
  const double core_s = 1e-9 * cluster.peers.cpu_ns_per_byte * 2 * (n - 1) / n * bytes;
  if (cluster.device.kind != "cpu") return {core_s, false};
  return {core_s * cluster.cluster.slowdown(peers), true};
}

Prediction predict_swarm(const Config& config, int64_t peers, const Cluster& cluster, const CostOptions& options,
                         bool with_memory) {
  const SwarmOptions& swarm = config.swarm;
  if (swarm.sync == "batch" && swarm.overlap_rounds == "auto") {  // the way the swarm's probe finds faster
    Config overlapped = config, after = config;
    overlapped.swarm.overlap_rounds = "always";
    after.swarm.overlap_rounds = "never";
    Prediction a = predict_swarm(overlapped, peers, cluster, options, with_memory);
    Prediction b = predict_swarm(after, peers, cluster, options, with_memory);
    return a.step_s <= b.step_s ? a : b;
  }
  require(cluster.peers.bandwidth_gbs > 0, cluster.source, ": a swarm needs the [peers] link (peers.bandwidth_gbs), which "
          "this cluster file does not give");
  require(swarm.sync == "batch" || swarm.sync == "diloco", "swarm.sync = ", swarm.sync, ": batch or diloco");
  require(swarm.pseudo_gradient_rank == 0 || swarm.sync != "diloco", "tessera plan: swarm.pseudo_gradient_rank is not "
          "modelled yet (dense and top-k pseudo-gradients are)");
  const Config local = peer_config(config, peers);
  const ParallelDims one(local.parallel, 1, "tessera plan");
  CostOptions sharing = options;
  sharing.busy_ranks = peers;  // peers placed as ranks are: a node's devices_per_node share it
  const PricedOperations priced = price_operations(local, one, cluster, sharing);
  Prediction out = predict_time(local, one, cluster, sharing, &priced);
  if (with_memory) add_memory(out, local, one, cluster);
  const double elements = priced.total().parameters;

  double round = 0, outer = 0, beside_backward = 0;
  if (swarm.sync == "batch") {
    const int64_t steps = swarm.mean_all_reduce == "ring" && peers >= 3 ? 2 * (peers - 1) : 2;
    const double fixed = swarm_round_seconds(0, peers, cluster, steps);
    const RoundCpu cpu = round_cpu(4 * elements, peers, cluster);
    double transfer = swarm_round_seconds(4 * elements, peers, cluster, steps) - fixed;
    if (rounds_overlap(config)) {
      const PartCost all = priced.total();
      double window = all.i + all.w;
      if (cpu.on_compute_cores) {
        beside_backward = cpu.seconds;  // the cores' share of the round, added to the backward's
        window += cpu.seconds;
      } else {
        transfer = std::max(transfer, cpu.seconds);
      }
      const double last_row = transfer / kRoundRows;
      transfer = std::max(0.0, transfer - last_row - window) + last_row;
    } else {
      transfer = std::max(transfer, cpu.seconds);
    }
    round = transfer + fixed;
  } else {
    const double value = swarm.pseudo_gradient_dtype == "fp32" ? 4 : swarm.pseudo_gradient_dtype == "bf16" ? 2 : 1;
    const double per_element = swarm.topk_ratio < 1 ? swarm.topk_ratio * (value + 2) : value;
    const double rate = 1e9 * (cluster.host.optimizer_gbs > 0 ? cluster.host.optimizer_gbs : cluster.device.memory_gbs);
    const double steps = static_cast<double>(swarm.inner_steps);
    const double fixed = swarm_round_seconds(0, peers, cluster);
    const double transfer = swarm_round_seconds(per_element * elements, peers, cluster) - fixed;
    round = (std::max(transfer, round_cpu(per_element * elements, peers, cluster).seconds) + fixed) / steps;
    outer = 24 * elements / rate / steps;
  }
  out.step_s += round + outer + beside_backward;
  out.breakdown.push_back({"swarm_round", round});
  out.breakdown.push_back({"swarm_round_cpu", beside_backward});
  out.breakdown.push_back({"swarm_outer_step", outer});
  const double tokens = static_cast<double>(local.train.batch_size * local.train.seq_len * out.micro_batches) *
                        static_cast<double>(peers);
  out.tokens_per_s = tokens / out.step_s;
  out.model_flops_per_step = flops_per_token(config.model, config.train.seq_len) * tokens;
  out.mfu = out.model_flops_per_step /
            (out.step_s * static_cast<double>(peers) * 1e12 * cluster.device.peak_tflops(config.precision.dtype != "fp32"));
  return out;
}

}  // namespace tessera::plan
