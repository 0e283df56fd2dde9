// Per-rank memory of a configured run, from a meta-device model (memory_estimate.h).
#include "plan/memory_estimate.h"

#include <algorithm>
#include <cstdio>
#include <string>

#include "core/error.h"
#include "optim/state_size.h"
#include "plan/activation_estimate.h"
#include "model/transformer.h"
#include "model/parameter_census.h"
#include "parallel/pipeline/schedule_builders.h"
#include "parallel/pipeline/simulate.h"
#include "plan/stage_cut.h"

namespace tessera {

double MemoryEstimate::device_bytes() const {
  const double state = parameter_bytes + (optimizer_on_host ? 0 : optimizer_bytes);
  const double backward = state + (gradients_at_peak ? gradient_bytes : 0) + activation_bytes_per_micro_batch +
                          working_bytes + in_flight_bytes + weight_copy_bytes;
  return std::max(backward, state + gradient_bytes);
}

double MemoryEstimate::device_lower_bound_bytes() const {
  const double state = parameter_bytes + (optimizer_on_host ? 0 : optimizer_bytes);
  return std::max(state + (gradients_at_peak ? gradient_bytes : 0) + activation_bytes_per_micro_batch,
                  state + gradient_bytes);
}

double MemoryEstimate::host_bytes() const {
  return (optimizer_on_host ? optimizer_bytes : 0) + offload_host_bytes + activation_host_bytes;
}

namespace {

// Whether bf16 autocast makes a bf16 copy of the parameter for a product, which that product's
// backward keeps: the linears' weights and biases, the experts', the untied head's and, on a stage
// computing the head, the tied token embedding. Not the norms' (layer_norm and rms_norm run in
// float32 under autocast), the MoE router's (computed in float32: model/moe.cpp), the learned
// positions', nor the token embedding of a stage without the head (a lookup: found on a pp4 1F1B
// bf16 run, whose rank 0 measured 56.2 MiB where its embedding counted once per held micro-batch
// predicted 60.7).
bool copied_by_autocast(const std::string& name, bool stage_has_head) {
  if (name.rfind("wte.", 0) == 0) return stage_has_head;
  if (name.rfind("wpe.", 0) == 0 || name.rfind("ln_f.", 0) == 0) return false;
  for (const char* part : {".ln_1.", ".ln_2.", ".q_norm.", ".k_norm.", ".router."})
    if (name.find(part) != std::string::npos) return false;
  return true;
}

// Whether a block's product keeps the float32 parameter for its backward instead of a bf16 copy:
// ZeRO-3 without a pipeline holds model/linear.h's KeepFloatWeightsForBackward around each block's
// forward (parallel/data/zero3.cpp), and every block product but the experts' (model/moe.cpp casts
// them itself) goes through linear().
bool kept_float_by_zero3(const CensusEntry& item, const ParallelDims& dims, int64_t zero_stage) {
  return zero_stage >= 3 && dims.pp() == 1 && item.spec.block >= 0 && item.spec.split != Split::expert;
}

// Whether the product is Megatron-SP's sequence-gathered linear (parallel/tensor/tp_comm.h), which
// keeps the float32 parameter and casts it only while its forward and backward products run: under
// Megatron-SP with tp > 1 the softmax attention's input projections and the dense MLP's first.
bool sequence_gathered(const std::string& name, const ModelOptions& m, const ParallelDims& dims, bool megatron_sp) {
  if (!megatron_sp || dims.tp() == 1) return false;
  if (name.find(".mlp.c_fc.") != std::string::npos) return true;
  if (m.arch == "linear") return false;  // lightning attention takes the region's input once
  for (const char* part : {".attn.c_attn.", ".attn.q_proj.", ".attn.kv_proj."})
    if (name.find(part) != std::string::npos) return true;
  return false;
}

// The estimate for a rank holding `stage` of the model (the whole model: ModelStage{}), whose
// schedule keeps up to held[k] micro-batches' activations of one of its stages at once while k of
// them await their W, before the step's first gradients on the rank (`held_before`) and from then
// on (`held_with`) (pipeline::Simulation::peak_held_awaiting_w_*; without a pipeline {} and {1}),
// and whose backward is split into I and W (`splits`: the rank's row has an I).
MemoryEstimate estimate_rank(const Config& config, const ParallelDims& dims, const ModelStage& stage,
                             const std::vector<int64_t>& held_before, const std::vector<int64_t>& held_with,
                             bool splits = false) {
  const ModelOptions& m = config.model;
  const ParallelOptions& p = config.parallel;
  MemoryEstimate e;
  const bool fp16 = config.precision.dtype == "fp16";
  const double param_bytes = parameter_element_bytes(config);
  // ZeRO shards a parameter over the ranks holding a replica of it: every data- and
  // sequence-parallel rank (parallelize.cpp, step 5), or for an expert's the dp x sp / ep of them
  // holding the same experts (data_parallel.h, reduction groups).
  const double replicas = static_cast<double>(dims.dp() * dims.sp());
  double optimizer_elements_bytes = 0, sharded_elements = 0, sharded_optimizer_bytes = 0;
  std::map<int64_t, double> unit_elements;  // this rank's elements by block (-1: the ends)
  double autocast_copied = 0;                // of them, those bf16 autocast copies (copied_by_autocast)
  for (const CensusEntry& item : *parameter_census(m, stage)) {
    const at::Tensor& t = item.meta;
    const Split split = item.spec.split;
    // A split tensor's share: one of its tp chunks (a replicated key/value head where heads are fewer).
    const double share = split == Split::replicated ? 1.0
                         : split == Split::expert   ? 1.0 / static_cast<double>(dims.ep())
                                                    : 1.0 / static_cast<double>(tensor_parallel_chunks(item.spec, dims.tp()));
    const double local = static_cast<double>(t.numel()) * share;
    const double holders = split == Split::expert ? replicas / static_cast<double>(dims.ep()) : replicas;
    e.parameters_rank += static_cast<int64_t>(local);
    if (copied_by_autocast(item.name, stage.head(m)) && !sequence_gathered(item.name, m, dims, p.megatron_sp) &&
        !kept_float_by_zero3(item, dims, p.zero_stage))
      autocast_copied += local;
    unit_elements[std::max<int64_t>(item.spec.block, -1)] += local;
    double state = optimizer_state_bytes(config.optim, t, share);
    if (fp16) state += 4 * local;  // fp32 master
    optimizer_elements_bytes += state;
    sharded_elements += local / holders;
    sharded_optimizer_bytes += state / holders;
  }
  const double P = static_cast<double>(e.parameters_rank);
  e.parameter_bytes = (p.zero_stage >= 3 ? sharded_elements : P) * param_bytes;
  e.gradient_bytes = (p.zero_stage >= 2 ? sharded_elements : P) * param_bytes;
  e.optimizer_bytes = p.zero_stage >= 1 ? sharded_optimizer_bytes : optimizer_elements_bytes;
  e.optimizer_on_host = p.offload;
  if (p.offload) e.offload_host_bytes = sharded_elements * (4 + 4);
  // Gradients exist at the backward's peak where data parallelism keeps them between steps (DDP's
  // buckets, ZeRO's flat buffers and shards) or an earlier micro-batch of the step made them: under
  // a pipeline in the moments after the rank's first B or W, without one from the second
  // micro-batch on.
  const int64_t accumulation = config.train.accumulation(dims.dp());
  const bool kept_between_steps = replicas > 1;
  double largest_block = 0, blocks = 0;
  for (const auto& [block, n] : unit_elements)
    if (block >= 0) largest_block = std::max(largest_block, n), blocks += 1;
  const double ends = unit_elements.count(-1) ? unit_elements.at(-1) : 0;
  // ZeRO-3's units gathered whole, by the backward's phase: with a pipeline the rank's whole stages
  // (held for the step) in both; without one, in the head's phase the ends alone (measured: a dp4
  // ZeRO-3 run's peak in the head's log-softmax backward was ZeRO-2's less the parameters' unsharded
  // remainder but the ends, 2026-12-01), in the block phase the ends and three blocks.
  double gathered_head = 0, gathered_block = 0;
  if (p.zero_stage >= 3 && replicas > 1) {
    const bool whole_stage = dims.pp() > 1 && !p.zero3_reshard_per_microbatch;
    gathered_block = (whole_stage ? P : ends + std::min(3.0, blocks) * largest_block) * param_bytes;
    gathered_head = whole_stage ? gathered_block : ends * param_bytes;
  }
  // ZeRO-2 and 3 reduce-scatter each micro-batch's gradients unit by unit, up to two at once; the
  // last two of a micro-batch before the last (the ends and block 0, each a full flat gradient and
  // its shard) are still in flight when the next micro-batch's backward peaks
  // (data_parallel_reduce.cpp). Measured without a pipeline only.
  if (p.zero_stage >= 2 && replicas > 1 && accumulation > 1 && dims.pp() == 1)
    e.in_flight_bytes += (ends + largest_block) * param_bytes * (1 + 1 / replicas);

  const int64_t tokens = config.train.seq_len / dims.sp();
  const double element_bytes = activation_element_bytes(config);
  // This rank's blocks' activations for one micro-batch (plan/activation_estimate.h), times the
  // micro-batches a pipeline schedule holds at once (in units of one stage's; 1 without one).
  // A block's count depends on its layer only through whether it is an MoE block: each kind once.
  // Under full checkpointing the backward recomputes one block at a time: its whole activations
  // (the largest block's, as without checkpointing) are held beside the stored inputs.
  Config whole = config;
  whole.memory.activation_checkpointing = "none";
  const bool full = config.memory.activation_checkpointing == "full";
  // Blocks below memory.activation_offload keep theirs in host memory; the device holds at most two
  // of their groups at once (one stored or used, the next fetched ahead), of one micro-batch.
  double per_token = 0, recomputed = 0, offloaded = 0, offloaded_largest = 0, awaiting_extra = 0, largest = 0;
  int64_t offloaded_blocks = 0;
  double kept_by_i = 0;  // what an I keeps for its W, over the rank's blocks (AwaitingW::kept)
  std::map<bool, double> stored;  // by whether the block is an MoE block
  std::map<bool, AwaitingW> awaiting_by_kind;
  for (const int64_t layer : stage.layers(m)) {
    const bool moe = m.is_moe_block(layer);
    auto it = stored.find(moe);
    if (it == stored.end()) {
      it = stored.emplace(moe, block_activation_bytes_per_token(config, dims, layer, element_bytes)).first;
      awaiting_by_kind[moe] = awaiting_w_bytes_per_token(config, dims, layer);
      if (full) recomputed = std::max(recomputed, block_activation_bytes_per_token(whole, dims, layer, element_bytes));
    }
    awaiting_extra += awaiting_by_kind[moe].extra();
    kept_by_i += awaiting_by_kind[moe].kept;
    largest = std::max(largest, it->second);
    if (layer < config.memory.activation_offload) {
      offloaded += it->second;
      offloaded_largest = std::max(offloaded_largest, it->second);
      ++offloaded_blocks;
    } else {
      per_token += it->second;
    }
  }
  // The head's product keeps the logits' gradient for its W too (V / tp per token).
  if (stage.head(m))
    awaiting_extra += static_cast<double>(m.padded_vocab()) / static_cast<double>(dims.tp()) *
                      compute_element_bytes(config);
  const double chunks = stage.whole() ? 1.0 : static_cast<double>(stage.chunks.size());
  double in_flight = static_cast<double>(std::min<int64_t>(offloaded_blocks, 2)) * offloaded_largest;
  // memory.resident_micro_batches under a pipeline: of the micro-batches held before their I, that
  // many keep their blocks' activations on the device and the others' wait on the host, every
  // block of them offloaded, with 2 + v of their block groups on the device at once for v stages
  // on the rank: the one a forward fills, the one before it still storing, and one per stage
  // fetched ahead when its output gradient's receive is posted, and never more than the offloaded
  // micro-batches have. Set from the interleaved pp2 R = 1 run (four groups in flight); checked on
  // the 1F1B and R = 2 runs, which it bounds (bench/results/pipeline_held_offload_cpu.md).
  const int64_t resident = dims.pp() > 1 ? config.memory.resident_micro_batches : 0;
  const double stage_blocks = static_cast<double>(stage.layers(m).size()) / chunks;
  const double micro_batch_tokens = static_cast<double>(config.train.batch_size * tokens);
  // A moment of the schedule: its micro-batches' saved activations, and for those awaiting their W
  // what their I kept less what it released (awaiting_w_bytes_per_token); under bf16 autocast
  // the products' bf16 copies of the float32 weights, which their backward keeps: 2 bytes per
  // parameter of the rank's stage that autocast copies (copied_by_autocast; whole under ZeRO-3),
  // made by each forward (its own autocast region), so once for every micro-batch held (found from
  // a traced pp2 1f1b bf16 peak, 2026-12-01); and the gradients where they exist by then.
  struct Moment {
    bool exists = false;
    double activations = 0, copies = 0;
    int64_t most_held = 0, most_on_host = 0;  // micro-batches held, and of them offloaded whole
    bool gradients = false;
    double bytes(double gradient_bytes) const { return activations + copies + (gradients ? gradient_bytes : 0); }
  };
  // Beside the blocks, a pipeline rank holds each micro-batch's stage output, for a stage that sends
  // one, and the head's saved tensors (pipeline_held_bytes_per_token), from its F to its B or I:
  // of `before_i` stage-micro-batches held, the sending stages' share and the head stage's, less
  // the one whose backward the working set counts.
  const PipelineHeld boundary = dims.pp() > 1 ? pipeline_held_bytes_per_token(config, dims) : PipelineHeld{};
  const double head_chunks = stage.head(m) ? 1.0 : 0.0;
  auto boundary_bytes = [&](int64_t before_i) {
    const double pairs = static_cast<double>(before_i);
    return boundary.output * pairs * (chunks - head_chunks) / chunks +
           boundary.head * head_chunks * std::max(0.0, pairs / chunks - 1);
  };
  auto moment = [&](const std::vector<int64_t>& held, bool gradients) {
    Moment out;
    out.gradients = gradients;
    double units = 0;
    for (size_t k = 0; k < held.size(); ++k) {
      if (held[k] < 0) continue;
      out.exists = true;
      const int64_t on_device = resident > 0 ? std::min(held[k], resident) : held[k];
      units = std::max(units, per_token / chunks * static_cast<double>(on_device) +
                                  awaiting_extra / chunks * static_cast<double>(k) +
                                  boundary_bytes(held[k] - static_cast<int64_t>(k)));
      out.most_held = std::max(out.most_held, held[k]);
      out.most_on_host = std::max(out.most_on_host, held[k] - on_device);
    }
    const double held_groups = std::min(2 + chunks, static_cast<double>(out.most_on_host) * stage_blocks);
    const double groups = std::max(in_flight, held_groups * largest);
    out.activations = (units + groups + recomputed) * micro_batch_tokens;
    // bf16 copies: one set for the step (precision/autocast.h, WeightCastCache), but under ZeRO-3 in
    // a pipeline each held micro-batch's own (parallel/pipeline_step.h).
    if (config.precision.dtype == "bf16" && out.most_held > 0)
      out.copies = dims.pp() > 1 && p.zero_stage >= 3
                       ? 2 * autocast_copied / chunks * static_cast<double>(out.most_held)
                       : 2 * autocast_copied;
    return out;
  };
  const Moment before = moment(held_before, kept_between_steps);
  const Moment with = moment(held_with, kept_between_steps || dims.pp() > 1 || accumulation > 1);
  const Moment& peak =
      !with.exists || (before.exists && before.bytes(e.gradient_bytes) > with.bytes(e.gradient_bytes)) ? before : with;
  e.gradients_at_peak = peak.gradients;
  e.activation_bytes_per_micro_batch = peak.activations;
  e.activation_bytes_per_token = peak.activations / micro_batch_tokens - recomputed;
  e.weight_copy_bytes = peak.copies;
  e.activation_host_bytes =
      (offloaded / chunks * static_cast<double>(std::max(before.most_held, with.most_held)) +
       (per_token / chunks) * static_cast<double>(std::max(before.most_on_host, with.most_on_host))) *
      micro_batch_tokens;
  // The phase whose working set and gathered units hold more: its two terms.
  const BackwardWorkingSet working = backward_working_bytes(config, dims, stage.head(m), !stage.layers(m).empty());
  const bool head_phase = stage.head(m) && working.head + gathered_head >= working.block + gathered_block;
  e.working_bytes = head_phase ? working.head : working.block;
  // Under a split backward the I's peak comes at its end, before the release (AwaitingW): one
  // stage's kept gradients, its input gradient and on the head's rank the head's saved tensors
  // (which boundary_bytes leaves to the working set) and the logits' gradient kept for its W.
  // Found on the 22 layouts' pp2 zbh1 row (a per-action trace of the tensor bytes, 2026-12-02:
  // the head rank's I rose 6.5 MiB above its start, where the working set said 2.75).
  if (splits) {
    const double logits_gradient =
        static_cast<double>(m.padded_vocab()) / static_cast<double>(dims.tp()) * compute_element_bytes(config);
    const double head_terms = stage.head(m) ? boundary.head + logits_gradient : 0;
    const double input_gradient = boundary.output;
    e.working_bytes =
        std::max(e.working_bytes, (kept_by_i / chunks + input_gradient + head_terms) * micro_batch_tokens);
  }
  e.in_flight_bytes += head_phase ? gathered_head : gathered_block;
  // ZeRO-2 and 3 under a pipeline reduce-scatter every micro-batch's gradients, unit by unit, in
  // the order of their units (data_parallel_reduce.cpp): a unit's gradients are flattened into one
  // tensor once the last of them arrives, the unit before still in flight (its flat gradient and
  // shard), and the unit a backward reduces last (the ends where the rank has them) stays in flight
  // until the next backward launches one. Three moments of a backward can hold most:
  //   start          the moment's micro-batches, the working set, the last unit of the backward
  //                  before (none before the rank's first)
  //   first unit     its gradients and their flat copy, one block's activations gone, the unit of
  //                  the backward before still in flight, and on the head's rank the ends'
  //                  gradients (they arrive first and are reduced last)
  //   end            the micro-batch's activations (and under ZeRO-3 its copies) gone but the stage's
  //                  first block flattened beside the block after it in flight, with the head's
  //                  ends; on a rank whose ends come last (the embedding's), their own flattening
  // Found on held-out set 11's pp2 x dp2 GPipe ZeRO-3 row (a per-node trace of the head rank's first
  // backward: its peak at the end, 14.9 MiB above the backward's start where the working set said
  // 6.6) and held-out set 12's pp2 x dp2 1F1B ZeRO-2 row (rank 0's peak at its second backward's
  // first unit, the first backward's embedding still in flight; 2026-12-04).
  if (p.zero_stage >= 2 && replicas > 1 && dims.pp() > 1) {
    const double unit = largest_block * param_bytes, end_units = ends * param_bytes;
    const double in_flight_share = 1 + 1 / replicas;
    const double last_reduced = (ends > 0 ? end_units : unit) * in_flight_share;
    const double head_ends = stage.head(m) ? end_units : 0;
    const double at_end = std::max(head_ends + 2 * unit + unit * in_flight_share,
                                   stage.head(m) ? 0.0 : 2 * end_units + unit * in_flight_share);
    const double one_block = largest * micro_batch_tokens;
    const double one_micro_batch = per_token / chunks * micro_batch_tokens;
    const double one_copy = config.precision.dtype == "bf16" && p.zero_stage >= 3 ? 2 * autocast_copied / chunks : 0;
    const double start_working = e.working_bytes, gathered = e.in_flight_bytes;
    double most = e.device_bytes() - e.parameter_bytes - (e.optimizer_on_host ? 0 : e.optimizer_bytes);
    auto consider = [&](const Moment& at, double freed_activations, double freed_copies, double working,
                        double in_flight) {
      const double total = at.bytes(e.gradient_bytes) - freed_activations - freed_copies + working + in_flight;
      if (total <= most) return;
      most = total;
      e.gradients_at_peak = at.gradients;
      e.activation_bytes_per_micro_batch = at.activations - freed_activations;
      e.activation_bytes_per_token = e.activation_bytes_per_micro_batch / micro_batch_tokens - recomputed;
      e.weight_copy_bytes = at.copies - freed_copies;
      e.working_bytes = working;
      e.in_flight_bytes = in_flight;
    };
    for (const Moment* at : {&before, &with}) {
      if (!at->exists || at->most_held == 0) continue;
      const double previous = at == &with ? last_reduced : 0;
      consider(*at, 0, 0, start_working, gathered + previous);
      consider(*at, one_block, 0, 0, gathered + previous + head_ends + 2 * unit);
      consider(*at, one_micro_batch, one_copy, 0, gathered + at_end);
    }
  }
  return e;
}

}  // namespace

double model_state_lower_bound(const Config& config, const ParallelDims& dims) {
  const MemoryEstimate whole = estimate_rank(config, dims, ModelStage{}, {}, {0});
  return (whole.parameter_bytes + whole.gradient_bytes + (whole.optimizer_on_host ? 0 : whole.optimizer_bytes)) /
         static_cast<double>(dims.pp());
}

std::vector<MemoryEstimate> estimate_memory_by_rank(const Config& config, const Layout& layout) {
  const ModelOptions& m = config.model;
  const ParallelDims& dims = layout.dims();
  std::vector<MemoryEstimate> ranks;
  if (dims.pp() == 1) {
    ranks.push_back(estimate_rank(config, dims, ModelStage{}, {}, {1}));
  } else {
    // A count of held activations is in units of one stage's (the simulator's), so with several
    // stages per rank (interleaved, V placement) it takes their mean, not their sum.
    const pipeline::Simulation sim = pipeline::simulate_schedule(layout.schedule(), {}, pipeline::Timeline::skip);
    const std::string pipeline = describe_pipeline_layout(config, dims, layout.cut(), layout.schedule());
    for (int64_t r = 0; r < dims.pp(); ++r) {
      const std::vector<pipeline::Action>& row = layout.schedule().ranks[static_cast<size_t>(r)];
      const bool splits = std::any_of(row.begin(), row.end(), [](const pipeline::Action& a) { return a.op == pipeline::Op::I; });
      MemoryEstimate rank = estimate_rank(config, dims, layout.stage_of(r), sim.peak_held_awaiting_w_before_gradients[r],
                                          sim.peak_held_awaiting_w_with_gradients[r], splits);
      rank.pipeline_rank = r;
      rank.pipeline_held = sim.peak_held[r];
      rank.pipeline_held_before_gradients = sim.peak_held_awaiting_w_before_gradients[r];
      rank.pipeline_held_with_gradients = sim.peak_held_awaiting_w_with_gradients[r];
      rank.pipeline = pipeline;
      ranks.push_back(std::move(rank));
    }
  }
  std::map<std::string, int64_t> by_component;
  int64_t total = 0;
  for (const CensusEntry& item : *parameter_census(m)) {
    total += item.meta.numel();
    const ParameterSpec& spec = item.spec;
    by_component[spec.block >= 0 ? "blocks" : spec.end == ModelEnd::head ? "head" : "embedding"] += item.meta.numel();
  }
  for (MemoryEstimate& rank : ranks) {
    rank.parameters_total = total;
    rank.parameters_by_component = by_component;
  }
  return ranks;
}

MemoryEstimate estimate_memory(const Config& config, const Layout& layout) {
  // Every pipeline rank's stages and the activations its schedule holds; the table shows the rank
  // that needs the most.
  std::vector<MemoryEstimate> ranks = estimate_memory_by_rank(config, layout);
  size_t largest = 0;
  for (size_t r = 1; r < ranks.size(); ++r)
    if (ranks[r].device_bytes() > ranks[largest].device_bytes()) largest = r;
  return std::move(ranks[largest]);
}

}  // namespace tessera
