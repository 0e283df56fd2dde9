// The planner's prices of one micro-batch's operations on one rank (cost_model.h's
// price_operations, the Pricer), the collective formulas and what the cost model refuses.
#include "plan/cost_model.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "core/error.h"
#include "memory/activation_codec.h"
#include "model/operations.h"
#include "model/parameter_census.h"
#include "plan/activation_estimate.h"
#include "plan/activation_policy.h"

namespace tessera::plan {
namespace {

using Kind = Operation::Kind;

class Pricer {
 public:
  Pricer(const Config& config, const ParallelDims& dims, const Cluster& cluster, const CostOptions& options)
      : cluster_(cluster),
        half_(config.precision.dtype != "fp32"),
        slowdown_(cluster.cluster.slowdown(options.busy_ranks > 0 ? options.busy_ranks : dims.world_size())),
        memory_slowdown_(cluster.cluster.memory_slowdown(options.busy_ranks > 0 ? options.busy_ranks : dims.world_size())),
        rate_(1e12 * cluster.device.matmul_tflops(half_) / slowdown_),
        attention_rate_(1e12 * cluster.device.attention_tflops(half_) / slowdown_),
        bandwidth_(1e9 * cluster.device.memory_gbs / memory_slowdown_),
        overhead_(1e-6 * cluster.device.kernel_overhead_us),
        matmul_overhead_(1e-6 * cluster.device.matmul_overhead_us),
        element_bytes_(half_ ? 2 : 4),
        compression_(config.parallel.grad_compression),
        powersgd_rank_(static_cast<double>(config.parallel.powersgd_rank)),
        fp32_rate_(1e12 * cluster.device.matmul_tflops(false) / slowdown_),
        megatron_sp_(config.parallel.megatron_sp) {
    tp_ = group(dims, "tp");
    sp_ = group(dims, "sp");
    ep_ = group(dims, "ep");
    const std::vector<int64_t> ep_members = dims.group_of("ep", 0);
    std::set<int64_t> nodes;
    std::vector<int64_t> first_node;
    for (int64_t rank : ep_members) {
      nodes.insert(cluster.node_of(rank));
      if (cluster.node_of(rank) == cluster.node_of(ep_members.front())) first_node.push_back(rank);
    }
    ep_nodes_ = static_cast<int64_t>(nodes.size());
    ep_node_tier_ = cluster.tier(first_node);
    // Between nodes every rank sends at once, each through its own link.
    ep_between_tier_ = ep_.tier;
    ep_between_tier_.bandwidth_bytes_per_s =
        std::min(cluster.intra_node.bandwidth_gbs, cluster.inter_node.bandwidth_gbs) * 1e9;
  }

  int64_t ep_nodes() const { return ep_nodes_; }
  int64_t tp() const { return tp_.n; }

  double element_bytes() const { return element_bytes_; }
  double slowdown() const { return slowdown_; }
  double memory_slowdown() const { return memory_slowdown_; }

  // Forward, and backward input-gradient (I) and weight-gradient (W) seconds of one operation.
  struct Times {
    double f = 0, i = 0, w = 0;
    bool collective = false;
  };
  Times time(const Operation& op) const {
    Times t;
    switch (op.kind) {
      case Kind::matmul: {
        // A product [m, k] x [k, n]: forward at the rate of its shape; with a weight, its input
        // gradient [m, n] x [n, k] and weight gradient [k, m] x [m, n] at theirs.
        auto seconds = [&](double rows, double cols, double depth) {
          const double rate = op.fused_attention ? attention_rate_
                              : op.rows > 0 ? 1e12 * cluster_.device.product_tflops(half_, rows, cols, depth) / slowdown_
                                            : rate_;
          return std::max(op.flops / rate, op.bytes / bandwidth_) + overhead_ + matmul_overhead_;
        };
        t.f = seconds(op.rows, op.cols, op.depth);
        if (op.weight) t.i = seconds(op.rows, op.depth, op.cols), t.w = seconds(op.depth, op.cols, op.rows);
        else t.i = op.backward_factor * t.f;
        return t;
      }
      case Kind::memory:
        t.f = op.bytes / bandwidth_ + overhead_;
        t.i = op.backward_factor * t.f;
        return t;
      case Kind::tp_all_reduce: {
        // Under Megatron-SP an all-gather and a reduce-scatter of the same bytes: two calls.
        t.f = t.i = all_reduce_seconds(op.elements * element_bytes_, tp_.n, tp_.tier) +
                    (megatron_sp_ && tp_.n > 1 ? tp_.tier.call_overhead_s : 0);
        // Under Megatron-SP the region's column product gathers its kept input again for its
        // weight gradient (parallel/tensor/tp_comm.h, sequence_gathered_linear).
        if (megatron_sp_) t.w = all_gather_seconds(op.elements * element_bytes_, tp_.n, tp_.tier);
        // The copies around each collective (parallel/tensor/tp_comm.cpp), each read and written
        // at the memory rate: an all-reduce sums into a copy of its input (2 x the tensor moved); a
        // sequence all-gather or reduce-scatter moves the sequence dimension of [B, T, C] to the
        // front for its input (1/N or all of the tensor) and back for its output (all or 1/N):
        // 2 x (1 + 1/N) x the tensor. Under Megatron-SP each direction runs two collectives, and
        // the weight gradient's gather one.
        const double tensor = op.elements * element_bytes_, n = static_cast<double>(tp_.n);
        const double copies = 2 * tensor * (megatron_sp_ ? 1 + 1 / n : 1) / bandwidth_;
        t.f += (megatron_sp_ ? 2 : 1) * copies;
        t.i += (megatron_sp_ ? 2 : 1) * copies;
        if (megatron_sp_) t.w += copies;
        break;
      }
      case Kind::sp_all_to_all:
        // Each exchange permutes its tensor into the all-to-all's layout and back
        // (parallel/sequence/ulysses.cpp): two copies, each read and written at the memory rate.
        t.f = t.i = all_gather_seconds(op.elements * element_bytes_, sp_.n, sp_.tier) +
                    4 * op.elements * element_bytes_ / bandwidth_;
        break;
      case Kind::sp_ring:
      case Kind::sp_kv_ring:
        t.f = t.i = static_cast<double>(sp_.n - 1) * send_seconds(op.elements * element_bytes_, sp_.tier);
        // Ring attention's backward also sends its float32 key/value gradients around the ring.
        if (op.kind == Kind::sp_kv_ring) t.i += static_cast<double>(sp_.n) * send_seconds(op.elements * 4, sp_.tier);
        break;
      case Kind::ep_all_to_all:
        // Across nodes each rank sends the part of its rows bound for other nodes through its own
        // link, (ep - R) / ep of them (R of the group's ranks per node).
        t.f = t.i = ep_nodes_ > 1
                        ? op.elements * element_bytes_ * static_cast<double>(ep_.n - ep_.n / ep_nodes_) /
                                  static_cast<double>(ep_.n) / ep_between_tier_.bandwidth_bytes_per_s +
                              static_cast<double>(ep_.n - 1) * ep_.tier.latency_s + ep_.tier.call_overhead_s
                        : all_gather_seconds(op.elements * element_bytes_, ep_.n, ep_.tier);
        break;
      case Kind::ep_between_nodes:
      case Kind::ep_within_node: {
        // The bytes leaving this rank at its link's rate; three calls forward (counts, ids, rows),
        // one backward.
        const Cluster::Tier& tier = op.kind == Kind::ep_between_nodes ? ep_between_tier_ : ep_node_tier_;
        t.f = send_seconds(op.elements * element_bytes_, tier) + 2 * tier.call_overhead_s + 2 * tier.latency_s;
        t.i = send_seconds(op.elements * element_bytes_, tier);
        break;
      }
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
      if (op.expert) c.expert_parameters += op.parameters;
      forward += t.f;
      if (op.attention_core) core_forward += t.f;
      c.f += t.f, c.i += t.i, c.w += t.w;
      const double both = t.f + t.i + t.w;
      if (op.attention_core) c.attention += both;
      else if (op.kind == Kind::matmul) c.products += both;
      else if (!t.collective) c.memory_bound += both;
      else if (op.kind == Kind::tp_all_reduce) c.tp += both;
      else if (op.kind == Kind::ep_all_to_all || op.kind == Kind::ep_between_nodes || op.kind == Kind::ep_within_node)
        c.ep += both;
      else c.sp += both;
    }
    for (const Operation& op : ops) add_compression(op, c);
    c.recompute = checkpointing == "full" ? forward : checkpointing == "selective" ? core_forward : 0;
    c.i += c.recompute;
    return c;
  }

 private:
  // PartCost::lowrank and ::compress of one operation's weights: a product's [cols, depth] weight
  // matrices (the experts' several) compressed where r'(n + m) < n m, anything else (biases, norms,
  // the embedding, whose shape the operations do not declare as a product) whole.
  void add_compression(const Operation& op, PartCost& c) const {
    if (op.parameters <= 0) return;
    const double matrix = op.kind == Kind::matmul && op.weight ? op.depth * op.cols : 0;
    const double count = matrix > 0 ? std::floor(op.parameters / matrix) : 0;
    const double r = std::min({op.depth, op.cols, powersgd_rank_});
    const bool compressed = count > 0 && r * (op.depth + op.cols) < matrix;
    c.lowrank += op.parameters - (compressed ? count * (matrix - r * (op.depth + op.cols)) : 0);
    if (compression_ == "powersgd")
      c.compress += (compressed ? count * 6 * matrix * r / fp32_rate_ : 0) + 32 * op.parameters / bandwidth_;
    else if (compression_ == "topk")
      c.compress += 24 * op.parameters / bandwidth_;
  }

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
  double slowdown_, memory_slowdown_, rate_, attention_rate_, bandwidth_, overhead_, matmul_overhead_, element_bytes_;
  std::string compression_;
  double powersgd_rank_, fp32_rate_;
  bool megatron_sp_;
  Group tp_, sp_, ep_;
  int64_t ep_nodes_ = 1;
  Cluster::Tier ep_node_tier_;     // the ep group's ranks on one node
  Cluster::Tier ep_between_tier_;  // one rank's link to other nodes
};

}  // namespace

double optimizer_bytes_per_element(const Config& config) {
  if (config.optim.name == "adamw") return 28;
  return 20;
}

double all_reduce_seconds(double bytes, int64_t n, const Cluster::Tier& tier) {
  if (n <= 1) return 0;
  const double steps = static_cast<double>(n - 1);
  const double tree_depth = std::ceil(std::log2(static_cast<double>(n)));
  return 2 * steps / static_cast<double>(n) * bytes / tier.bandwidth_bytes_per_s +
         2 * std::min(steps, tree_depth) * tier.latency_s + tier.call_overhead_s;
}

double all_gather_seconds(double bytes, int64_t n, const Cluster::Tier& tier) {
  if (n <= 1) return 0;
  const double steps = static_cast<double>(n - 1);
  return steps / static_cast<double>(n) * bytes / tier.bandwidth_bytes_per_s + steps * tier.latency_s +
         tier.call_overhead_s;
}

double send_seconds(double bytes, const Cluster::Tier& tier) {
  return bytes / tier.bandwidth_bytes_per_s + tier.latency_s + tier.call_overhead_s;
}

namespace {

// Tensor parallelism's gradient shares (parallel/tensor/gradient_shares.h), counted per part, their
// sums once a step priced with the reduction (cost_model.cpp): over tp, parameter_spec.h's
// gradient_summed_over_tp (under Megatron-SP the norms, the row-parallel biases, an MoE layer's;
// every per-head one); over the key/value replicas, this rank's chunk of a column-split tensor
// whose whole heads are fewer than the tp ranks (kv_proj).
void count_gradient_shares(const Config& config, const Pricer& pricer, PricedOperations& out) {
  if (pricer.tp() <= 1) return;
  for (const CensusEntry& item : *parameter_census(config.model)) {
    const ParameterSpec& spec = item.spec;
    PartCost& part = spec.block >= 0 ? out.blocks[static_cast<size_t>(spec.block)] : out.head;
    const double elements = static_cast<double>(item.meta.numel());
    if (gradient_summed_over_tp(spec, config.parallel.megatron_sp)) part.tp_shares += elements;
    const int64_t chunks = tensor_parallel_chunks(spec, pricer.tp());
    if (spec.split == Split::column && chunks < pricer.tp()) part.kv_shares += elements / static_cast<double>(chunks);
  }
}

// memory.activation_offload = N: blocks 0 to N-1 send what they save to the host after their
// forward and fetch it before their backward; memory.resident_micro_batches: every block does
// for the held micro-batches its rank offloads (held_offload, weighed by the layout). The copies
// run over the host link (a CPU "device": the run's modelled link, memory.modelled_bandwidth_gbps,
// where it is the slower), beside the block's own compute, and on a CPU "device" the memcpys also
// take the computing cores, at the streaming rate the file measured (device.memory_gbs; measured
// against runs in docs/plan.md: it under-prices a CPU's copies about 2x).
void add_activation_offload(const Config& config, const ParallelDims& dims, const Cluster& cluster, double slowdown,
                            std::vector<PartCost>& blocks) {
  const int64_t offloaded = std::min<int64_t>(config.memory.activation_offload, static_cast<int64_t>(blocks.size()));
  const bool held = config.memory.resident_micro_batches > 0 && dims.pp() > 1;
  if (offloaded <= 0 && !held) return;
  const bool cpu = cluster.device.kind == "cpu";
  double link = 1e9 * cluster.host.device_link_gbs;
  if (cpu) link = link > 0 ? std::min(link, 1e9 * config.memory.modelled_bandwidth_gbps) : 1e9 * config.memory.modelled_bandwidth_gbps;
  require(link > 0, cluster.source, ": ", offloaded > 0 ? "memory.activation_offload" : "memory.resident_micro_batches",
          " needs host.device_link_gbs, which this cluster file leaves at 0");
  const double per_byte = cpu ? slowdown / (1e9 * cluster.device.memory_gbs) : 0;
  const int64_t priced = held ? static_cast<int64_t>(blocks.size()) : offloaded;
  for (int64_t l = 0; l < priced; ++l) {
    PartCost& c = blocks[static_cast<size_t>(l)];
    const double copies = offload_copy_seconds(block_activation_bytes(config, dims, l), c.f, c.i + c.w, link, per_byte);
    if (l < offloaded) {
      c.offload = copies;
      c.i += c.offload;
    } else if (held) {
      c.held_offload = copies;
    }
  }
}

// memory.activation_compression: each block encodes what it saves at the end of its forward and
// decodes it in its backward, at the rate the cluster file measured for the codec
// (device.activation_codec_*_gbs: float32 source bytes per second, encoding and decoding together),
// slowed as the compute is, per element of what the block saves less its float32 statistics (which
// no codec encodes); half in the forward, half in the backward. What a codec keeps as it is costs
// nothing: bf16 under a 16-bit compute dtype, lossless's tensors (its bool masks, a byte per
// element at most, are not priced). The attention core's elements under memory.attention_compression
// at its codec's rate. Under memory.activation_policy = auto the policy's choices are priced instead.
// The cluster file's rate for a codec (int8, int4, fp8 or bf16), refused naming the key where the
// file leaves it at 0.
double codec_gbs(ActivationCodec codec, const Cluster& cluster) {
  const double gbs = codec == ActivationCodec::int8  ? cluster.device.activation_codec_int8_gbs
                     : codec == ActivationCodec::int4 ? cluster.device.activation_codec_int4_gbs
                     : codec == ActivationCodec::fp8 ? cluster.device.activation_codec_fp8_gbs
                                                     : cluster.device.activation_codec_bf16_gbs;
  const char* name = activation_codec_name(codec);
  require(gbs > 0, cluster.source, ": the activation codec ", name, " (memory.activation_compression or memory.attention_compression) needs device.activation_codec_", name,
          "_gbs, which this cluster file leaves at 0 (`tessera plan calibrate` measures it)");
  return gbs;
}

void add_activation_compression(const Config& config, const ParallelDims& dims, const Cluster& cluster, double slowdown,
                                std::vector<PartCost>& blocks) {
  if (config.memory.activation_policy == "auto") return;
  const ActivationCodec codec = applied_activation_codec(config);
  const ActivationCodec core = parse_attention_codec(config.memory.attention_compression).value_or(codec);
  const double e = compute_element_bytes(config);
  // Seconds per element a codec encodes and decodes (0: it keeps the element as it is).
  auto seconds_per_element = [&](ActivationCodec c) {
    if (c == ActivationCodec::none || c == ActivationCodec::lossless || (c == ActivationCodec::bf16 && e < 4)) return 0.0;
    return 4 * slowdown / (1e9 * codec_gbs(c, cluster));
  };
  if (seconds_per_element(codec) == 0 && seconds_per_element(core) == 0) return;
  Config plain = config;
  plain.memory.activation_compression = "none";
  plain.memory.attention_compression = "same";
  // The attention core's elements (memory.attention_compression): as kept whole, its share of the
  // block's; as its codec encodes them, priced at that codec's rate.
  const double tokens = static_cast<double>(config.train.batch_size * (config.train.seq_len / dims.sp()));
  auto core_elements = [&](ActivationCodec c) {
    const AttentionCoreElements in_core = attention_core_elements_per_token(plain, dims, c);
    return (in_core.compute + 4 * in_core.float32 / e) * tokens;
  };
  const double core_kept = core_elements(ActivationCodec::none), core_encoded = core_elements(core);
  for (size_t l = 0; l < blocks.size(); ++l) {
    const double elements =
        (block_activation_bytes(plain, dims, static_cast<int64_t>(l)) - block_statistics_bytes(plain, dims)) / e;
    const double coding =
        (elements - core_kept) * seconds_per_element(codec) + core_encoded * seconds_per_element(core);
    PartCost& c = blocks[l];
    c.f += coding / 2;
    c.i += coding / 2;
    c.memory_bound += coding;
  }
}

// memory.activation_policy = auto: the run's policy (plan/activation_policy.h) chooses each
// block's option from these blocks' predicted F and B (B = I + W), the host link (CUDA) or on a CPU
// "device" the copy rate at device.memory_gbs and the modelled link, and each allowed codec's rate;
// each block's chosen seconds go into its I.
void add_activation_policy(const Config& config, const ParallelDims& dims, const Cluster& cluster, double slowdown,
                           PricedOperations& out) {
  // Under swap the policy is chosen with the swap plan (swap_cost.h).
  if (config.memory.activation_policy != "auto" || config.memory.swap) return;
  LayoutMeasurements measured;
  measured.blocks = predicted_block_costs(config, cluster, slowdown, out.blocks);
  measured.cpu_device = cluster.device.kind == "cpu";
  out.activation_policies = make_layout(config, dims, measured).activation_policies();
  for (const ActivationPolicy& policy : out.activation_policies)
    for (size_t k = 0; k < policy.layers.size(); ++k) {
      PartCost& c = out.blocks.at(static_cast<size_t>(policy.layers[k]));
      c.activation_policy = policy.blocks[k].seconds;
      c.i += c.activation_policy;
    }
}

}  // namespace

BlockCosts predicted_block_costs(const Config& config, const Cluster& cluster, double slowdown,
                                 const std::vector<PartCost>& blocks) {
  BlockCosts costs;
  for (const PartCost& c : blocks) {
    // A pipeline's cut by time reads these (plan/stage_cut.h); the policy its own bytes.
    costs.block_seconds.push_back(c.f + c.i + c.w);
    costs.block_activation_bytes.push_back(0);
    costs.block_split.push_back({c.f, c.i + c.w, c.i, c.w});
  }
  const bool cpu = cluster.device.kind == "cpu";
  if (cpu) costs.copy_bytes_per_s = 1e9 * cluster.device.memory_gbs / slowdown;
  else costs.link_bytes_per_s = 1e9 * cluster.host.device_link_gbs;
  require(cpu || costs.link_bytes_per_s > 0, cluster.source,
          ": memory.activation_policy = auto needs host.device_link_gbs, which this cluster file leaves at 0");
  for (ActivationCodec codec : encoding_codecs(config))
    costs.codec_seconds_per_byte[activation_codec_name(codec)] = slowdown / (1e9 * codec_gbs(codec, cluster));
  return costs;
}

void check_modelled(const Config& config) {
  const ParallelOptions& p = config.parallel;
  require(p.pp_schedule.rfind("file:", 0) != 0, "tessera plan: parallel.pp_schedule = file:... is not modelled (the built-in schedules are)");
}

PricedOperations price_operations(const Config& config, const ParallelDims& dims, const Cluster& cluster,
                                  const CostOptions& options) {
  check_modelled(config);
  const ModelOptions& model = config.model;
  const ParallelOptions& p = config.parallel;
  const Pricer pricer(config, dims, cluster, options);
  PricedOperations out;
  out.memory_slowdown = pricer.memory_slowdown();
  OperationShape& shape = out.shape;
  shape.batch = config.train.batch_size;
  shape.seq_len = config.train.seq_len;
  shape.tp = dims.tp(), shape.sp = dims.sp(), shape.ep = dims.ep();
  shape.ep_hierarchical = p.ep_dispatch == "hierarchical";
  shape.ep_nodes = pricer.ep_nodes();
  shape.megatron_sp = p.megatron_sp;
  shape.sp_method = p.sp_method == "auto" ? (model.arch == "linear" ? "lasp" : "ulysses") : p.sp_method;
  shape.element_bytes = static_cast<int64_t>(pricer.element_bytes());
  shape.attention = options.attention;
  shape.dropout = model.dropout;
  require(options.expert_load >= 1, "tessera plan: --expert-load is the busiest ep rank's rows over an even share, "
          "at least 1; got ", options.expert_load);
  shape.expert_load = options.expert_load;
  for (int64_t layer = 0; layer < model.n_layer; ++layer)
    out.blocks.push_back(pricer.part(block_operations(model, layer, shape), config.memory.activation_checkpointing));
  add_activation_compression(config, dims, cluster, pricer.memory_slowdown(), out.blocks);
  add_activation_offload(config, dims, cluster, pricer.memory_slowdown(), out.blocks);
  add_activation_policy(config, dims, cluster, pricer.memory_slowdown(), out);
  out.embedding = pricer.part(embedding_operations(model, shape), "none");
  out.head = pricer.part(head_operations(model, shape), "none");
  count_gradient_shares(config, pricer, out);
  return out;
}


}  // namespace tessera::plan
