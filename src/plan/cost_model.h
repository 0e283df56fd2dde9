// The planner's cost model (`tessera plan`, docs/plan.md): one layout of one config on one cluster
// (plan/cluster.h), priced action by action, without running anything.
//
// Compute. Each block's operations (model/operations.h: what its kind declares, per rank, per
// micro-batch) are priced on the device by a roofline: a product takes max(FLOPs / the device's
// achievable matrix rate, bytes / its streaming bandwidth), a memory-bound kernel its bytes /
// bandwidth, each plus the fixed kernel cost. Where the cluster file has a table of product rates
// by shape (plan/matmul_table.h), a bf16 product's forward, input gradient and weight gradient
// each take the rate of their own shape. A block's forward F is its operations' forward plus
// its collectives (tp all-reduces, Ulysses' all-to-alls, ring steps, the experts' exchange, each
// priced on the tier its group crosses); its input-gradient backward I is the products' input
// gradients, the others' backward and the collectives again, plus recomputation (full: the
// block's forward; selective: the attention core's); W is the weight gradients. The embedding
// and the head with the loss are priced the same way.
//
// Step. Without a pipeline: micro-batches x (F + I + W) of every block and the ends, then the
// gradient reduction over the data replicas (all-reduce; ZeRO-2/3 reduce-scatter, ZeRO-1/2 the
// parameters' all-gather after the step), overlapped with the last micro-batch's backward as the
// bucketed reduction runs, and the optimizer step (bytes moved per element of this rank's shard).
// ZeRO-3 gathers each block's parameters in the forward and again in the backward, prefetched one
// block ahead: exposed only where a gather takes longer than the block it runs beside. The
// reduction runs one collective per bucket (parallel.bucket_mb) and ZeRO-3 one gather per block,
// each paying its ring's latency steps.
// With a pipeline: the blocks' predicted F, I, W are cut into stages as a run cuts them
// (plan/stage_cut.h) and the layout's schedule table (built for these costs, as a run rebuilds
// zbv's and zbh1's for its measured ones) is replayed by the one simulator
// (parallel/pipeline/simulate.h) with the transfers between stages priced on their link, the
// ZeRO-3 gathers as its GATHER actions, and the gradient reduction's exposed part and the
// optimizer step as OPTIM. A rank's sends leave its one link one after another in that replay
// (ActionCosts::sends_share_a_link; a middle rank's link carries activations on and gradients
// back, m of each per step), so on a slow link the step is its busiest link's sends and what the
// schedule makes wait for them (GPipe's gradients start back only after its last forward's
// activations crossed). Where a CPU node's ranks share its cores, the replay runs each compute
// action at the sharing of the ranks computing beside it (plan/shared_cores.h), and a send's
// copying takes the sender's core at device.socket_gbs where every core computes.
//
// Memory: the per-rank estimate of plan/memory_estimate.h (the largest rank; a swapped layout's
// plan's peak occupancy), against the device's memory, and what it keeps on the host (offloaded
// optimizer state, a swapped model's state) x the node's ranks against the host's; on a CPU
// device, whose memory is the host's, the peak counts both. The data-parallel reduction's size is the weights the operations declare
// (model/operations.h) on the rank that holds the most.
//
// Beside the device: parallel.offload's copies and host step (the shard's gradient down, the
// masters back, the step at host.optimizer_gbs); memory.swap's step from the swap engine's own
// replay (plan/swap_cost.h); an ATOM swarm's rounds (plan/swarm_cost.h); PowerSGD's and top-k's
// compressed reductions (PartCost::lowrank, ::compress), in their steady state after their start
// steps.
//
// Saved activations: memory.activation_compression's encoding in each block's forward and decoding
// in its backward at the codec's calibrated rate (in memory_bound; operation_prices.cpp);
// memory.activation_offload's copies beyond what the blocks hide (PartCost::offload);
// memory.activation_policy = auto: the run's own policy (plan/activation_policy.h) chooses each
// block's option from the blocks' predicted F and B, the host link (on a CPU "device" the copy
// rate device.memory_gbs and the modelled link) and the codec's rate, and each block's choice adds
// its seconds (PartCost::activation_policy); memory is each rank's model state and its policy's
// bytes. A search under auto prices each layout on its own (the choice depends on the ZeRO stage
// and the schedule) and holds memory.activation_checkpointing, which the policy chooses.
//
// Not modelled (refused by key, so no prediction silently leaves them out):
// file: schedules, low-rank pseudo-gradients.
#pragma once

#include <cstdint>
#include <map>
#include <tuple>
#include <string>
#include <utility>
#include <vector>

#include "config/config.h"
#include "core/parallel_dims.h"
#include "model/operations.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/simulate.h"
#include "plan/cluster.h"
#include "plan/layout.h"
#include "plan/stage_cut.h"

namespace tessera::plan {

struct CostOptions {
  // How softmax attention's core runs: flash (tessera on CUDA: SDPA's fused kernel) or unfused (the
  // scores materialized: Megatron-LM in 2021, for its published runs).
  std::string attention = "flash";
  // Ranks computing at once over the cluster's nodes, which slow each other's compute by the
  // node's sharing factor (ClusterInfo::slowdown); 0: the layout's own world. A swarm's peers
  // placed on shared nodes set it (plan/swarm_cost.h).
  int64_t busy_ranks = 0;
  // Dropless routing under expert parallelism: the busiest ep rank's routed rows over an even
  // share (>= 1; `--expert-load`). Every exchange waits for the busiest rank, so its experts'
  // products set the step; an earlier run's metrics show it (moe.load: each expert's rows per
  // layer). Capacity routing computes its capacity's slots whatever the load: unchanged by it.
  double expert_load = 1;
};

struct Prediction {
  double step_s = 0;
  double tokens_per_s = 0;
  double model_flops_per_step = 0;   // flops_per_token x tokens (recomputation not counted)
  double mfu = 0;                    // model FLOPs / (step x world x the device's peak)
  double peak_memory_bytes = 0;      // the largest rank's estimate (plan/memory_estimate.h)
  bool fits = false;                 // peak_memory_bytes <= the device's memory
  bool memory_estimated = false;     // add_memory ran (peak_memory_bytes and fits are known)
  int64_t micro_batches = 0;         // per step on each data-parallel rank
  // Seconds of the step on the critical rank: compute (products, attention, memory-bound kernels),
  // recompute, tp, sp and ep communication
  // (per micro-batch x micro-batches), pipeline transfer and bubble, the data-parallel reduction's
  // exposed part, ZeRO-3's exposed gathers and the optimizer step; they add up to step_s.
  std::vector<std::pair<std::string, double>> breakdown;
  // memory.activation_policy = auto: each rank's choice as its run would make it from the
  // predicted costs (by pipeline rank; one without a pipeline), filled with the memory.
  std::vector<ActivationPolicy> activation_policies;
};

// Refuses (tessera::Error naming the key) what the cost model does not model.
void check_modelled(const Config& config);

// One block's (or end's) predicted costs for one micro-batch on one rank.
struct PartCost {
  double f = 0, i = 0, w = 0;          // the pipeline's F, I, W (recomputation inside I)
  // Forward + backward compute by kind, no collectives, no recomputation: products (with a weight,
  // or two activations outside attention), the attention core (its products and, unfused, its
  // softmax), and the memory-bound kernels (norms, activations, residuals, the loss, and the saved
  // activations' encoding and decoding under memory.activation_compression).
  double products = 0, attention = 0, memory_bound = 0;
  double recompute = 0;
  // memory.activation_offload: the copies of the block's saved activations to the host and back
  // beyond what its forward and backward hide (plan/activation_policy.h, offload_copy_seconds);
  // inside I, as the backward waits for them.
  double offload = 0;
  // memory.resident_micro_batches: what the same copies cost for a held micro-batch the block's
  // pipeline rank offloads (0 where memory.activation_offload already offloads it); a layout adds
  // it to the block's I weighted by the share of its stage's forwards the table offloads
  // (pipeline::held_offloaded_forwards).
  double held_offload = 0;
  // memory.activation_policy = auto: what the block's chosen option adds (recomputation, copies,
  // coding: plan/activation_policy.h), priced from the block's predicted F and B; inside I.
  double activation_policy = 0;
  double tp = 0, sp = 0, ep = 0;       // collectives, forward + backward
  double parameters = 0;               // weight elements held (operations.h)
  double expert_parameters = 0;        // the routed experts' part of them
  // With parallel.grad_compression = powersgd: the elements its weights' gradients travel as
  // (r'(n + m) per compressed [n, m] matrix, r' = min(n, m, powersgd_rank), the others whole); and
  // the compressor's own seconds per step (PowerSGD: its three products per matrix at the float32
  // rate and 32 bytes per element of residual and write-back passes; top-k: 24 bytes per element
  // of selection and residual passes).
  double lowrank = 0, compress = 0;
  // The elements of the parameters whose gradient a tp rank holds only its share of
  // (parallel/tensor/gradient_shares.h), summed once a step after the reduction: over tp, and over
  // the tp ranks holding the same key/value heads (their chunk of kv_proj).
  double tp_shares = 0, kv_shares = 0;
  void operator+=(const PartCost& o) {
    f += o.f, i += o.i, w += o.w, products += o.products, attention += o.attention, memory_bound += o.memory_bound;
    recompute += o.recompute, offload += o.offload, held_offload += o.held_offload;
    activation_policy += o.activation_policy;
    tp += o.tp, sp += o.sp, ep += o.ep;
    parameters += o.parameters, expert_parameters += o.expert_parameters, lowrank += o.lowrank, compress += o.compress;
    tp_shares += o.tp_shares, kv_shares += o.kv_shares;
  }
};

// Every block's and end's operations (model/operations.h) priced for one micro-batch on one rank:
// the same for layouts that differ only in their schedule and ZeRO stage, so a search prices them
// once for each tp, pp, Megatron-SP, checkpointing and micro-batch.
struct PricedOperations {
  OperationShape shape;
  double memory_slowdown = 1;  // the memory-bound kernels' slowdown the prices include (ClusterInfo::memory_slowdown)
  std::vector<PartCost> blocks;
  PartCost embedding, head;
  // memory.activation_policy = auto: each pipeline rank's choice (one without a pipeline), made by
  // the run's own policy from these blocks' predicted costs.
  std::vector<ActivationPolicy> activation_policies;
  // One micro-batch of every part: the whole model on one rank (its weights: total().parameters).
  PartCost total() const {
    PartCost all = embedding;
    all += head;
    for (const PartCost& c : blocks) all += c;
    return all;
  }
};
PricedOperations price_operations(const Config& config, const ParallelDims& dims, const Cluster& cluster,
                                  const CostOptions& options = {});
// The blocks' costs as the activation policy reads a run's start-up profile (plan/stage_cut.h's
// BlockCosts), from their predicted prices: F and B = I + W, the host link (a CPU "device": its
// copy rate at device.memory_gbs over `slowdown`), each allowed codec's calibrated rate.
BlockCosts predicted_block_costs(const Config& config, const Cluster& cluster, double slowdown,
                                 const std::vector<PartCost>& blocks);

// What a search shares between the layouts it prices:
//   cut     the pipeline's cut by shape (stages, stages per rank; the model is the search's);
//   table   the table by what builds it (the schedule, its ranks, stages per rank and
//           micro-batches, each stage's F, B, I, W and the transfer), so layouts that differ only
//           in what its GATHER and OPTIM actions cost (the ZeRO stage) share one; without its
//           parameter actions (parallel/pipeline/schedule.h);
//   layout  make_layout's cut and unit-cost table, which the memory estimate reads, by pipeline
//           shape (ranks, stages per rank, schedule, micro-batches, gathers), around the layout's
//           own degrees.
class PlanCache {
 public:
  const StageCut& cut(const Config& config, const ParallelDims& dims);
  const pipeline::Schedule& table(const ParallelOptions& parallel, int64_t pp, int64_t micro_batches,
                                  const pipeline::ActionCosts& costs);
  Layout layout(const Config& config, const ParallelDims& dims);

 private:
  using ShapeKey = std::tuple<int64_t, int64_t, std::string, int64_t, pipeline::Gathers>;
  std::map<std::pair<int64_t, int64_t>, StageCut> cuts_;
  std::map<std::tuple<std::string, int64_t, int64_t, int64_t, std::vector<double>>, pipeline::Schedule> tables_;
  std::map<ShapeKey, Layout> layouts_;
};

Prediction predict(const Config& config, const ParallelDims& dims, const Cluster& cluster, const CostOptions& options = {});
// The two halves of predict: the step (from the operations alone: no model is built; `priced`:
// the layout's price_operations where the caller has it; `cache`: a search's) and the memory (the estimate builds the
// model on the meta device and the layout's table: slower), so a search estimates memory only for
// the layouts it may show.
Prediction predict_time(const Config& config, const ParallelDims& dims, const Cluster& cluster,
                        const CostOptions& options = {}, const PricedOperations* priced = nullptr,
                        PlanCache* cache = nullptr);
void add_memory(Prediction& prediction, const Config& config, const ParallelDims& dims, const Cluster& cluster);
// The same for a layout already made (a search shares one cut and table between layouts of the
// same pipeline shape).
void add_memory(Prediction& prediction, const Config& config, const Layout& layout, const Cluster& cluster);
// A bound no layout's predicted step falls below, from the same prices without building its table:
// without a pipeline the step itself; with one, the OPTIM action (the reduction's exposed part and
// the optimizer step, which every rank runs last) after the largest of
//   a rank's work (m micro-batches of each of its stages) after the first forward reaches its
//   earliest stage;
//   the forward through every stage then the input gradients back (the transfers between ranks
//   included), with m - 1 more of the largest stage's forward or input gradient (the micro-batch
//   that leaves that stage last waits behind the others there) and stage 0's last W;
//   under 1F1B and GPipe, the fill and drain every rank waits through ((m - 1) times the largest
//   stage plus every stage once, the largest at least the mean).
// The search predicts layouts in the order of this bound and stops where it passes the best it
// must show. With a pipeline, the bound is also at least the busiest rank link's sends and OPTIM.
double step_lower_bound(const Config& config, const ParallelDims& dims, const Cluster& cluster,
                        const PricedOperations& priced, PlanCache* cache = nullptr);
// The same for layouts that differ only in their data-parallel side (parallel.zero_stage,
// parallel.offload, memory.swap, the reduction's keys): the compute, the cut and the stages'
// costs priced once.
std::vector<double> step_lower_bounds(const std::vector<Config>& variants, const ParallelDims& dims,
                                      const Cluster& cluster, const PricedOperations& priced, PlanCache* cache = nullptr);

// Bytes an optimizer step moves per element of the shard it updates, on the device or the host
// (offload, swap): AdamW reads the parameter, its gradient and both moments and writes the
// parameter and the moments (28); SGD with momentum the parameter, gradient and buffer and writes
// two (20); Adafactor about SGD's.
double optimizer_bytes_per_element(const Config& config);

// Collective times on `tier` for a group of `n` ranks (bytes of the whole buffer): all-reduce
// 2 (n-1)/n bytes / bandwidth (a ring's) + 2 min(n-1, ceil(log2 n)) latency (NCCL's tree where it
// has fewer steps than the ring); all-gather, reduce-scatter and all-to-all (n-1)/n bytes /
// bandwidth + (n-1) latency (rings); one send bytes / bandwidth + latency.
double all_reduce_seconds(double bytes, int64_t n, const Cluster::Tier& tier);
double all_gather_seconds(double bytes, int64_t n, const Cluster::Tier& tier);
double send_seconds(double bytes, const Cluster::Tier& tier);

}  // namespace tessera::plan
