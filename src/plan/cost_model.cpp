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
#include "plan/layout.h"
#include "plan/memory_estimate.h"
#include "plan/stage_cut.h"

namespace tessera::plan {
namespace {

using Kind = Operation::Kind;

// One block's (or end's) predicted costs for one micro-batch on one rank.
struct PartCost {
  double f = 0, i = 0, w = 0;          // the pipeline's F, I, W (recomputation inside I)
  double compute = 0;                  // forward + backward compute, no collectives, no recomputation
  double recompute = 0;
  double tp = 0, sp = 0, ep = 0;       // collectives, forward + backward
  double parameters = 0;               // weight elements held (operations.h)
  void operator+=(const PartCost& o) {
    f += o.f, i += o.i, w += o.w, compute += o.compute, recompute += o.recompute, tp += o.tp, sp += o.sp, ep += o.ep;
    parameters += o.parameters;
  }
};

class Pricer {
 public:
  Pricer(const Config& config, const ParallelDims& dims, const Cluster& cluster)
      : cluster_(cluster),
        half_(config.precision.dtype != "fp32"),
        slowdown_(cluster.cluster.slowdown(dims.world_size())),
        rate_(1e12 * cluster.device.matmul_tflops(half_) / slowdown_),
        attention_rate_(1e12 * cluster.device.attention_tflops(half_) / slowdown_),
        bandwidth_(1e9 * cluster.device.memory_gbs / slowdown_),
        overhead_(1e-6 * cluster.device.kernel_overhead_us),
        matmul_overhead_(1e-6 * cluster.device.matmul_overhead_us),
        element_bytes_(half_ ? 2 : 4) {
    tp_ = group(dims, "tp");
    sp_ = group(dims, "sp");
    ep_ = group(dims, "ep");
  }

  double element_bytes() const { return element_bytes_; }

  // Forward, and backward input-gradient (I) and weight-gradient (W) seconds of one operation.
  struct Times {
    double f = 0, i = 0, w = 0;
    bool collective = false;
  };
  Times time(const Operation& op) const {
    Times t;
    switch (op.kind) {
      case Kind::matmul: {
        const double one = std::max(op.flops / (op.fused_attention ? attention_rate_ : rate_), op.bytes / bandwidth_) +
                           overhead_ + matmul_overhead_;
        t.f = one;
        if (op.weight) t.i = one, t.w = one;
        else t.i = op.backward_factor * one;
        return t;
      }
      case Kind::memory:
        t.f = op.bytes / bandwidth_ + overhead_;
        t.i = op.backward_factor * t.f;
        return t;
      case Kind::tp_all_reduce:
        t.f = t.i = all_reduce_seconds(op.elements * element_bytes_, tp_.n, tp_.tier);
        break;
      case Kind::sp_all_to_all:
        t.f = t.i = all_gather_seconds(op.elements * element_bytes_, sp_.n, sp_.tier);
        break;
      case Kind::sp_ring:
        t.f = t.i = static_cast<double>(sp_.n - 1) * send_seconds(op.elements * element_bytes_, sp_.tier);
        break;
      case Kind::ep_all_to_all:
        t.f = t.i = all_gather_seconds(op.elements * element_bytes_, ep_.n, ep_.tier);
        break;
    }
    t.collective = true;
    return t;
  }

  PartCost part(const std::vector<Operation>& ops, const std::string& checkpointing) const {
    PartCost c;
    double forward = 0, core_forward = 0;
    for (const Operation& op : ops) {
      const Times t = time(op);
      c.parameters += op.parameters;
      forward += t.f;
      if (op.attention_core) core_forward += t.f;
      c.f += t.f, c.i += t.i, c.w += t.w;
      const double both = t.f + t.i + t.w;
      if (!t.collective) c.compute += both;
      else if (op.kind == Kind::tp_all_reduce) c.tp += both;
      else if (op.kind == Kind::ep_all_to_all) c.ep += both;
      else c.sp += both;
    }
    c.recompute = checkpointing == "full" ? forward : checkpointing == "selective" ? core_forward : 0;
    c.i += c.recompute;
    return c;
  }

 private:
  struct Group {
    int64_t n = 1;
    Cluster::Tier tier;
  };
  Group group(const ParallelDims& dims, const std::string& name) const {
    const std::vector<int64_t> members = dims.group_of(name, 0);
    return {static_cast<int64_t>(members.size()), cluster_.tier(members)};
  }

  const Cluster& cluster_;
  bool half_;
  double slowdown_, rate_, attention_rate_, bandwidth_, overhead_, matmul_overhead_, element_bytes_;
  Group tp_, sp_, ep_;
};

// Bytes the optimizer step moves per element of this rank's shard: AdamW reads the parameter, its
// gradient and both moments and writes the parameter and the moments; SGD with momentum the
// parameter, gradient and buffer (and writes two); Adafactor about SGD's.
double optimizer_bytes_per_element(const Config& config) {
  if (config.optim.name == "adamw") return 28;
  return 20;
}

}  // namespace

double all_reduce_seconds(double bytes, int64_t n, const Cluster::Tier& tier) {
  if (n <= 1) return 0;
  const double steps = static_cast<double>(n - 1);
  return 2 * steps / static_cast<double>(n) * bytes / tier.bandwidth_bytes_per_s + 2 * steps * tier.latency_s;
}

double all_gather_seconds(double bytes, int64_t n, const Cluster::Tier& tier) {
  if (n <= 1) return 0;
  const double steps = static_cast<double>(n - 1);
  return steps / static_cast<double>(n) * bytes / tier.bandwidth_bytes_per_s + steps * tier.latency_s;
}

double send_seconds(double bytes, const Cluster::Tier& tier) { return bytes / tier.bandwidth_bytes_per_s + tier.latency_s; }

void check_modelled(const Config& config) {
  const ParallelOptions& p = config.parallel;
  require(!p.offload, "tessera plan: parallel.offload is not modelled yet (docs/plan.md)");
  require(!config.memory.swap, "tessera plan: memory.swap is not modelled yet (docs/plan.md)");
  require(config.memory.activation_compression == "none",
          "tessera plan: memory.activation_compression is not modelled yet (docs/plan.md)");
  require(p.grad_compression == "none" || p.grad_compression == "bf16" || p.grad_compression == "fp16",
          "tessera plan: parallel.grad_compression = ", p.grad_compression, " is not modelled yet (none, bf16 and fp16 are)");
  require(p.pp_schedule.rfind("file:", 0) != 0, "tessera plan: parallel.pp_schedule = file:... is not modelled (the built-in schedules are)");
}

namespace {

// Every block's and end's operations priced for one micro-batch on one rank.
struct PricedModel {
  OperationShape shape;
  std::vector<PartCost> blocks;
  PartCost embedding, head;
};

PricedModel price_model(const Config& config, const ParallelDims& dims, const Pricer& pricer,
                        const CostOptions& options) {
  const ModelOptions& model = config.model;
  const ParallelOptions& p = config.parallel;
  PricedModel out;
  OperationShape& shape = out.shape;
  shape.batch = config.train.batch_size;
  shape.seq_len = config.train.seq_len;
  shape.tp = dims.tp(), shape.sp = dims.sp(), shape.ep = dims.ep();
  shape.megatron_sp = p.megatron_sp;
  shape.sp_method = p.sp_method == "auto" ? (model.arch == "linear" ? "lasp" : "ulysses") : p.sp_method;
  shape.element_bytes = static_cast<int64_t>(pricer.element_bytes());
  shape.attention = options.attention;
  shape.dropout = model.dropout;
  for (int64_t layer = 0; layer < model.n_layer; ++layer)
    out.blocks.push_back(pricer.part(block_operations(model, layer, shape), config.memory.activation_checkpointing));
  out.embedding = pricer.part(embedding_operations(model, shape), "none");
  out.head = pricer.part(head_operations(model, shape), "none");
  return out;
}

}  // namespace

MicroBatchWork micro_batch_work(const Config& config, const ParallelDims& dims, const Cluster& cluster,
                                const CostOptions& options) {
  check_modelled(config);
  const PricedModel priced = price_model(config, dims, Pricer(config, dims, cluster), options);
  PartCost all = priced.embedding;
  all += priced.head;
  for (const PartCost& c : priced.blocks) all += c;
  return {all.f, all.i, all.w};
}

double step_lower_bound(const Config& config, const ParallelDims& dims, const MicroBatchWork& work) {
  const double m = static_cast<double>(config.train.accumulation(dims.dp()));
  const double p = static_cast<double>(dims.pp());
  const std::string& schedule = config.parallel.pp_schedule;
  const double fill = p > 1 && (schedule == "1f1b" || schedule == "gpipe") ? (m + p - 1) / m : 1.0;
  const double shared = m * work.total() / p * fill;
  return p > 1 ? std::max(shared, work.forward + work.input_backward) : shared;
}

Prediction predict_time(const Config& config, const ParallelDims& dims, const Cluster& cluster,
                        const CostOptions& options) {
  check_modelled(config);
  const ModelOptions& model = config.model;
  const ParallelOptions& p = config.parallel;
  const Pricer pricer(config, dims, cluster);
  const PricedModel priced = price_model(config, dims, pricer, options);
  const OperationShape& shape = priced.shape;
  const std::vector<PartCost>& block_parts = priced.blocks;
  const PartCost& embedding = priced.embedding;
  const PartCost& head = priced.head;
  BlockCosts blocks;
  for (const PartCost& c : block_parts) {
    blocks.block_seconds.push_back(c.f + c.i + c.w);
    blocks.block_activation_bytes.push_back(0);
    blocks.block_split.push_back({c.f, c.i + c.w, c.i, c.w});
  }
  blocks.embedding_seconds = embedding.f + embedding.i + embedding.w;
  blocks.head_seconds = head.f + head.i + head.w;
  blocks.embedding_split = {embedding.f, embedding.i + embedding.w, embedding.i, embedding.w};
  blocks.head_split = {head.f, head.i + head.w, head.i, head.w};

  const int64_t m = config.train.accumulation(dims.dp());
  // Without a pipeline every rank holds every block; with one, the stages of each pipeline rank
  // (the cut and table below), the largest rank's weights.
  const double tied_copy = model.tie_embeddings ? static_cast<double>(model.n_embd) *
                                                      static_cast<double>(model.padded_vocab()) /
                                                      static_cast<double>(dims.tp())
                                                : 0;
  double params = embedding.parameters + head.parameters;
  for (const PartCost& c : block_parts) params += c.parameters;
  std::optional<StageCut> cut;
  std::optional<pipeline::Schedule> schedule;
  pipeline::ActionCosts costs;
  if (dims.pp() > 1) {
    cut = pipeline_cut(config, dims);
    add_measured_costs(*cut, blocks);
    costs.stages = cut->compute;
    const std::vector<int64_t> pp_group = dims.group_of("pp", 0);
    const double transfer_tokens = shape.tokens() / (p.megatron_sp ? static_cast<double>(dims.tp()) : 1.0);
    const double transfer_bytes = transfer_tokens * static_cast<double>(model.n_embd) *
                                  (p.pp_transfer_dtype == "float32" ? 4 : pricer.element_bytes());
    costs.transfer = send_seconds(transfer_bytes, cluster.tier({pp_group[0], pp_group[1]}));
    // The table for these costs (as a run rebuilds zbv's and zbh1's for its measured ones).
    schedule = pipeline::schedule_for_options(p, dims.pp(), m, layout_gathers(p, dims), costs);
    params = 0;
    for (int64_t rank = 0; rank < dims.pp(); ++rank) {
      double held = 0;
      for (int64_t s = 0; s < cut->stages(); ++s) {
        if (schedule->rank_of(s) != rank) continue;
        for (int64_t b = cut->boundaries[s]; b < cut->boundaries[s + 1]; ++b) held += block_parts[b].parameters;
        if (s == 0) held += embedding.parameters;
        if (s == cut->stages() - 1) held += head.parameters + tied_copy;
      }
      params = std::max(params, held);
    }
  }

  // The gradient reduction over the data replicas, and ZeRO's parameter gathers.
  const std::vector<int64_t> replicas = dims.group_of(replica_group_name(dims), 0);
  const int64_t n_replicas = static_cast<int64_t>(replicas.size());
  const Cluster::Tier replica_tier = cluster.tier(replicas);
  const double grad_bytes = (p.grad_compression != "none" || config.precision.dtype == "fp16") ? 2 : 4;
  const double param_bytes = config.precision.dtype == "fp16" ? 2 : 4;
  double reduce_per_step = 0, reduce_per_micro_batch = 0, gather_per_pass = 0;
  if (p.zero_stage <= 1) reduce_per_step = all_reduce_seconds(params * grad_bytes, n_replicas, replica_tier);
  else reduce_per_micro_batch = all_gather_seconds(params * grad_bytes, n_replicas, replica_tier);
  // ZeRO-1 and 2: each replica updates its shard, then the parameters are gathered: after the
  // step, overlapping nothing.
  const double gather_after_step = (p.zero_stage == 1 || p.zero_stage == 2)
                                       ? all_gather_seconds(params * param_bytes, n_replicas, replica_tier)
                                       : 0;
  if (p.zero_stage == 3) gather_per_pass = all_gather_seconds(params * param_bytes, n_replicas, replica_tier);
  const double shard = p.zero_stage >= 1 ? static_cast<double>(n_replicas) : 1.0;
  const double bandwidth = 1e9 * cluster.device.memory_gbs / cluster.cluster.slowdown(dims.world_size());
  const double optimizer = params / shard * optimizer_bytes_per_element(config) / bandwidth +
                           params * grad_bytes / bandwidth;  // + the clipping norm
  const double bucket = std::min(p.bucket_mb * 1e6, params * grad_bytes) / replica_tier.bandwidth_bytes_per_s;

  Prediction out;
  out.micro_batches = m;
  PartCost rank_total;  // one micro-batch of the critical rank's parts
  double reduce_exposed = 0, gather_exposed = 0, bubble = 0;
  if (dims.pp() == 1) {
    for (const PartCost& c : block_parts) rank_total += c;
    rank_total += embedding;
    rank_total += head;
    const double forward = rank_total.f, backward = rank_total.i + rank_total.w;
    // The bucketed reduction runs beside the last micro-batch's backward (every micro-batch's
    // under ZeRO-2/3); its last bucket only after it.
    if (reduce_per_micro_batch > 0)
      reduce_exposed = static_cast<double>(m) * (std::max(0.0, reduce_per_micro_batch - backward) + bucket);
    reduce_exposed += (reduce_per_step > 0 ? std::max(0.0, reduce_per_step - backward) + bucket : 0) + gather_after_step;
    if (gather_per_pass > 0) {
      const double one_block = gather_per_pass / static_cast<double>(model.n_layer);
      gather_exposed = static_cast<double>(m) * (std::max(0.0, gather_per_pass - forward) +
                                                 std::max(0.0, gather_per_pass - backward) + 2 * one_block);
    }
    out.step_s = static_cast<double>(m) * (forward + backward) + reduce_exposed + gather_exposed + optimizer;
  } else {
    const int64_t v = p.pipeline_virtual();
    costs.gather = gather_per_pass / static_cast<double>(v);
    // The reduction overlaps the rank's last backward of each stage; what is left, and the
    // optimizer step, is the OPTIM action.
    double last_backward = 0;
    for (const auto& stage : cut->compute) last_backward = std::max(last_backward, stage.i + stage.w);
    reduce_exposed = std::max(0.0, reduce_per_step - last_backward) +
                     static_cast<double>(m) * std::max(0.0, reduce_per_micro_batch - last_backward) + bucket +
                     gather_after_step;
    costs.optim = reduce_exposed + optimizer;
    const pipeline::Simulation sim = pipeline::simulate_schedule(*schedule, costs);
    require(sim.stuck.empty(), "internal: the planner's pipeline table did not run to its end");
    out.step_s = sim.step_time;
    const int64_t critical = std::max_element(sim.busy.begin(), sim.busy.end()) - sim.busy.begin();
    for (int64_t s = 0; s < cut->stages(); ++s) {
      if (schedule->rank_of(s) != critical) continue;
      for (int64_t b = cut->boundaries[s]; b < cut->boundaries[s + 1]; ++b) rank_total += block_parts[b];
      if (s == 0) rank_total += embedding;
      if (s == cut->stages() - 1) rank_total += head;
    }
    bubble = sim.step_time - sim.busy[critical] - costs.optim;
  }
  const double mb = static_cast<double>(m);
  out.breakdown = {{"compute", mb * rank_total.compute},
                   {"recompute", mb * rank_total.recompute},
                   {"tp_communication", mb * rank_total.tp},
                   {"sp_communication", mb * rank_total.sp},
                   {"ep_communication", mb * rank_total.ep},
                   {"pipeline_bubble_and_transfers", bubble},
                   {"zero3_gathers_exposed", gather_exposed},
                   {"dp_reduction_exposed", reduce_exposed},
                   {"optimizer", optimizer}};
  const double tokens = static_cast<double>(config.train.batch_size * config.train.seq_len) * mb *
                        static_cast<double>(dims.dp());
  out.tokens_per_s = tokens / out.step_s;
  out.model_flops_per_step = flops_per_token(model, config.train.seq_len) * tokens;
  const double peak = 1e12 * cluster.device.peak_tflops(config.precision.dtype != "fp32");
  out.mfu = out.model_flops_per_step / (out.step_s * static_cast<double>(dims.world_size()) * peak);
  return out;
}

void add_memory(Prediction& prediction, const Config& config, const ParallelDims& dims, const Cluster& cluster) {
  prediction.peak_memory_bytes = estimate_memory(config, make_layout(config, dims)).device_bytes();
  prediction.fits = prediction.peak_memory_bytes <= cluster.device.memory_bytes();
  prediction.memory_estimated = true;
}

Prediction predict(const Config& config, const ParallelDims& dims, const Cluster& cluster, const CostOptions& options) {
  Prediction prediction = predict_time(config, dims, cluster, options);
  add_memory(prediction, config, dims, cluster);
  return prediction;
}

}  // namespace tessera::plan
