// The planner's cost model (cost_model.h).
#include "plan/cost_model.h"
#include "plan/priced_layout.h"

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
#include "plan/shared_cores.h"
#include "plan/stage_cut.h"
#include "plan/swap_cost.h"

namespace tessera::plan {
namespace {

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
    out.costs.sends_share_a_link = true;
    // With no core to spare a send's copying takes the sender's core (its bytes through the
    // socket at the core's rate, device.socket_gbs, or the link's where none is given; the
    // receiver's wait is the transfer's delay).
    const double socket_bytes_per_s =
        cluster.device.socket_gbs > 0 ? 1e9 * cluster.device.socket_gbs : pp_tier.bandwidth_bytes_per_s;
    const double copying = every_core_computes(cluster, dims) ? transfer_bytes / socket_bytes_per_s : 0;
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
          held.kv_shares += block.kv_shares;
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

// The busiest rank link's sends in one step: per micro-batch one each way for every stage boundary
// the rank sits on (a middle rank of a pipeline sends activations on and gradients back, and
// receives both, through its one link).
double link_seconds(const PricedLayout& layout) {
  return static_cast<double>(layout.link_crossings * layout.m) * layout.costs.transfer;
}

// step_lower_bound's with a pipeline (cost_model.h lists its terms). `alone`: the stages' costs
// over the node's sharing factor, the fastest a replay on shared cores runs them (shared_cores.h).
double pipeline_lower_bound(const Config& config, const PricedLayout& layout, double alone) {
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
  return std::max(bound * alone, link_seconds(layout)) + layout.costs.optim;
}

PricedLayout price_layout(const Config& config, const ParallelDims& dims, const Cluster& cluster,
                          const PricedOperations& priced, PlanCache* cache) {
  return with_data_parallel(price_compute(config, dims, cluster, priced, cache), config, dims, cluster);
}

double bound_of(const Config& config, const ParallelDims& dims, const Cluster& cluster, const PricedLayout& layout) {
  // A swapped step's compute stream runs every forward and backward; the host's work may hide.
  if (config.memory.swap) return static_cast<double>(layout.m) * (layout.all.f + layout.all.i + layout.all.w);
  if (dims.pp() == 1) return layout.step_without_pipeline;
  const double alone = shares_cores(cluster, dims.world_size()) ? 1 / cluster.cluster.slowdown(dims.world_size()) : 1;
  return pipeline_lower_bound(config, layout, alone);
}

}  // namespace

double step_lower_bound(const Config& config, const ParallelDims& dims, const Cluster& cluster,
                        const PricedOperations& priced, PlanCache* cache) {
  return bound_of(config, dims, cluster, price_layout(config, dims, cluster, priced, cache));
}

std::vector<double> step_lower_bounds(const std::vector<Config>& variants, const ParallelDims& dims,
                                      const Cluster& cluster, const PricedOperations& priced, PlanCache* cache) {
  std::vector<double> out;
  if (variants.empty()) return out;
  const PricedLayout compute = price_compute(variants.front(), dims, cluster, priced, cache);
  for (const Config& v : variants) out.push_back(bound_of(v, dims, cluster, with_data_parallel(compute, v, dims, cluster)));
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
  double swapping = 0, held_copies = 0;
  double compute_scale = 1;  // shared cores: the replayed critical rank's busy time over its priced one
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
    // Ranks that share a CPU node's cores run faster where fewer of them compute (shared_cores.h).
    const bool shared = shares_cores(cluster, dims.world_size());
    const pipeline::Simulation sim =
        shared ? simulate_on_shared_cores(schedule, layout.costs, cluster, dims.world_size())
               : pipeline::simulate_schedule(schedule, layout.costs, pipeline::Timeline::skip);
    require(sim.stuck.empty(), "internal: the planner's pipeline table did not run to its end");
    // Each rank's sends leave its link one after another in the replay (sends_share_a_link), and
    // its OPTIM waits for the last: the busiest link's sends bound the step (link_seconds).
    out.step_s = sim.step_time;
    const int64_t critical = std::max_element(sim.busy.begin(), sim.busy.end()) - sim.busy.begin();
    const StageCut& cut = *layout.cut;
    for (int64_t s = 0; s < cut.stages(); ++s) {
      if (schedule.rank_of(s) != critical) continue;
      for (int64_t b = cut.boundaries[s]; b < cut.boundaries[s + 1]; ++b) rank_total += priced.blocks[b];
      if (s == 0) rank_total += priced.embedding;
      if (s == cut.stages() - 1) rank_total += priced.head;
    }
    if (!layout.held_copies.empty()) held_copies = layout.held_copies[static_cast<size_t>(critical)];
    // On shared cores the replay ran the critical rank's actions faster than priced: its parts
    // shrink alike, so that they and the bubble still add up to the step.
    if (shared) {
      double priced_busy = 0;
      for (int64_t s = 0; s < cut.stages(); ++s)
        if (schedule.rank_of(s) == critical)
          priced_busy += static_cast<double>(m) * (layout.costs.stages[static_cast<size_t>(s)].f +
                                                   layout.costs.stages[static_cast<size_t>(s)].b);
      if (priced_busy > 0) compute_scale = sim.busy[critical] / priced_busy;
    }
  }
  const double mb = static_cast<double>(m);
  const double parts = mb * compute_scale;  // the critical rank's m micro-batches, as replayed
  out.breakdown = {{"products", parts * rank_total.products},
                   {"attention", parts * rank_total.attention},
                   {"memory_bound", parts * rank_total.memory_bound},
                   {"recompute", parts * rank_total.recompute},
                   {"activation_offload_copies", parts * rank_total.offload + held_copies},
                   {"activation_policy", parts * rank_total.activation_policy},
                   {"tp_communication", parts * rank_total.tp},
                   {"tp_gradient_sum", tp_gradient_sum},
                   {"sp_communication", parts * rank_total.sp},
                   {"ep_communication", parts * rank_total.ep},
                   {"pipeline_bubble_and_transfers", 0},
                   {"zero3_gathers_exposed", gathers},
                   {"dp_reduction_exposed", reduce},
                   {"offload_copies", offload},
                   {"swap_link_and_host", swapping},
                   {"optimizer", optimizer}};
  if (dims.pp() > 1 && !config.memory.swap) {
    // The bubble and the transfers are what the step holds beyond its other parts (their entry is
    // 0 so far): the sends' copying (in the stages' replayed costs, in no part above) counts there.
    double parts_sum = 0;
    for (const auto& [name, seconds] : out.breakdown) parts_sum += seconds;
    const auto bubble = std::find_if(out.breakdown.begin(), out.breakdown.end(),
                                     [](const auto& term) { return term.first == "pipeline_bubble_and_transfers"; });
    bubble->second = out.step_s - parts_sum;
  }
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
