// The activation policy for a device budget (memory.activation_policy = auto; docs/memory.md):
// each block keeps its activations, offloads them, or recomputes them (selectively or whole,
// offloading the kept input too), and with the codecs memory.activation_compression allows may
// encode what it keeps or offloads; chosen to fit the budget at the least predicted step time.
//
// Per block and option, per micro-batch on this rank:
//   bytes    what the option leaves on the device from the block's forward to its backward: the
//            memory estimate's count for the option's checkpointing mode and codec (plan/
//            activation_estimate.h); for an offloaded block only its float32 statistics (which
//            stay), its group (the rest) in flight instead: the device holds two groups at once
//            (memory/activation_offload.h), a reserve of twice the largest offloaded group, kept
//            out of the budget;
//   seconds  what the option adds to the step, from the block's measured forward F and backward
//            B (the start-up profile, plan/profile_cut.h, the world's mean so that every rank
//            chooses alike): full recomputation F; selective the attention core's share of F
//            (by FLOPs, model/operations.h); offload the copies' time beyond what the block's
//            neighbours hide, max(0, g / link - B) + max(0, g / link - F) for a group of g bytes
//            over the link (on CUDA the profile's measured host link, on a CPU "device"
//            memory.modelled_bandwidth_gbps, its throttle); on a CPU "device" the two memcpys
//            also take the computing cores' time, 2 g / the profile's measured copy rate; a codec
//            its encoding and decoding of the bytes the option would keep uncompressed, at the
//            profile's measured rate on a tensor of the compute dtype (an upper bound where the
//            codec keeps some tensors as they are: bf16 keeps 16-bit ones).
// The codecs are an allowance: under auto, memory.activation_compression names the encodings a
// block may use, one or a comma-separated list ("bf16,int8"; none: no block encodes), each block
// choosing its own, and a lossy one changes the gradients of the blocks that choose it. The
// policy prices time and bytes only: where two codecs both fit, the faster is chosen, not the
// more exact. The choice: the least total seconds whose bytes fit (a knapsack over the blocks,
// bytes rounded up to 1/4096 of the budget, for each reserve an offloaded group size can need).
// Among blocks of one kind the cheaper options go to the latest blocks (the last block's
// activations are used first) and offload and encoding to the earliest (whose wait is longest),
// the smaller encoding first.
//
// The activations' budget: memory.device_budget_gb less the rank's model state on the device
// (activation_shares below); the head's and embedding's activations are not counted. Under a
// pipeline each rank chooses for its own blocks, their bytes times the micro-batches its schedule
// holds at once (every micro-batch gets the same choice); under a split backward (zbh1, zbv,
// dualpipev) those that ran their I count the option's bytes awaiting their W instead. Without a
// split backward a rank holding more than one micro-batch may also keep only R of them on the
// device and offload every block of the rest (ActivationPolicy::resident_micro_batches, the run's
// memory.resident_micro_batches): each R below the most it holds is tried, every option paying
// its held group's copies for the share of the rank's forwards offloaded (priced as an offload's,
// hidden behind the rank's whole stage: a held micro-batch waits at least one other's forward and
// backward, where a block's own offload has its neighbours' only), the offloaded micro-batches
// counted at their held_stays, and 2 + v of the largest block's groups reserved (v: the rank's
// stages; plan/memory_estimate.h); the cheapest choice that fits wins.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "config/config.h"
#include "core/parallel_dims.h"
#include "plan/stage_cut.h"

namespace tessera {

class Layout;

struct ActivationOption {
  std::string checkpointing = "none";  // none | selective | full
  bool offload = false;
  double bytes = 0;     // on the device, per micro-batch (offloaded: what stays)
  double group = 0;     // offloaded: the group's bytes (what it would keep resident)
  double seconds = 0;   // added to the step, per micro-batch
  std::string compression = "none";  // the codec of what it keeps or offloads (memory/activation_codec.h)
  // Under a schedule that splits the backward: on the device per micro-batch after its I, until
  // its W (what W needs and I's kept output gradients; 0 for a full recomputation, whose block
  // finishes its weight gradients inside I).
  double awaiting = 0;
  // Under a pipeline whose rank offloads its held micro-batches (ActivationPolicy::
  // resident_micro_batches): what one offloaded micro-batch copies of what this option keeps (0
  // for an option that offloads already), and what it leaves on the device (the float32
  // statistics; an offloading option's bytes).
  double held_group = 0, held_stays = 0;
  // "keep", "offload", "selective", "full", "full + offload", each with " + CODEC" when encoded
  std::string name() const;
};

// A moment of a pipeline rank's schedule: the micro-batches whose activations it holds before
// their I (or B), and those that ran their I and await their W, in units of one of its stages;
// `offloaded`: held micro-batches before their I whose blocks all wait in host memory (each holds
// its options' held_stays).
struct HeldMoment {
  double before_i = 1, awaiting_w = 0, offloaded = 0;
};

// One pipeline rank's choice (the whole model's without a pipeline).
struct ActivationPolicy {
  int64_t pipeline_rank = -1;            // -1: no pipeline
  std::vector<int64_t> layers;           // the blocks it decides (the rank's), in order
  std::vector<ActivationOption> blocks;  // their choices, parallel to layers
  double held = 1;                       // micro-batches whose activations the rank holds at once
  std::vector<HeldMoment> moments{{}};   // the schedule's moments the choice fits (ActivationShare)
  int64_t groups_in_flight = 2;          // offloaded groups the device may hold at once
  // Under a pipeline without a split backward: the rank keeps this many micro-batches (of a stage
  // each) on the device and offloads every block of those held beyond them (0: none; as
  // memory.resident_micro_batches does by hand), `held_offloaded` of its forwards
  // (pipeline::held_offloaded_forwards), with `held_reserve` bytes kept for their groups in flight.
  int64_t resident_micro_batches = 0;
  double held_offloaded = 0, held_reserve = 0;
  double budget_bytes = 0;               // for the blocks' activations
  // Chosen with the swap plan (plan/swap_policy.h): budget_bytes is the allowance of the candidate
  // chosen, the swap plan holding it within memory.device_budget_gb.
  bool with_swap_plan = false;
  double bytes = 0;                      // chosen: for the micro-batches held, with the reserves
  double seconds = 0;                    // added to the step, per micro-batch
  int64_t offloaded() const;
  const ActivationOption& of(int64_t layer) const;  // block `layer`'s choice (one of layers)
};

// What the activations of one pipeline rank's blocks may use (the whole model's without a
// pipeline): memory.device_budget_gb less the rank's model state on the device (parameters,
// gradients, optimizer state unless offloaded, the backward's working set, ZeRO-3's gathered
// units: plan/memory_estimate.h), refused naming the rank when nothing is left. Under a pipeline
// the rank's schedule holds `held` micro-batches' activations at once (the simulation's peak, in
// units of one of its stages, over its stages), and three offloaded groups can be in flight: a
// backward's two (its own and the one it prefetches) and the store the forward before it left
// running. Under a schedule that splits the backward (zbh1, zbv, dualpipev) a micro-batch that
// ran its I holds its option's `awaiting` bytes until its W: the share lists the schedule's
// moments by how many await their W (the simulation's peaks, before and after the rank's first
// gradients), and a choice fits each of them.
struct ActivationShare {
  int64_t pipeline_rank = -1;
  std::vector<int64_t> layers;
  double held = 1;                       // the most micro-batches held at once
  std::vector<HeldMoment> moments{{}};
  int64_t groups_in_flight = 2;
  double budget_bytes = 0;
};
std::vector<ActivationShare> activation_shares(const Config& config, const Layout& layout);

// What offloading `bytes` of a block's activations adds to the step, per micro-batch: the copies'
// time beyond what the block's neighbours hide, max(0, g / link - B) + max(0, g / link - F) for
// its forward F and backward B seconds over a link of `link_bytes_per_s`, plus, on a CPU "device",
// the two memcpys on the computing cores (2 g x `core_seconds_per_byte`; 0 on CUDA's copy engines).
// The policy's price of an offload, and the planner's (plan/cost_model.h).
double offload_copy_seconds(double bytes, double forward_s, double backward_s, double link_bytes_per_s,
                            double core_seconds_per_byte);

// Every option of every block, priced as above. `measured`: the blocks' F and B (block_split).
std::vector<std::vector<ActivationOption>> activation_options(const Config& config, const ParallelDims& dims,
                                                              const BlockCosts& measured, bool cpu_device);

// The cheapest choice for `options` (blocks 0.. in order; the caller names their layers) that
// fits `budget_bytes` at every one of `moments` (a block's option weighing, at the moment that
// needs the most of it, its bytes times the micro-batches before their I and its awaiting bytes
// times those awaiting their W: a bound on the sum's most over the moments) with
// `groups_in_flight` offloaded groups reserved; refuses, naming memory.device_budget_gb and what
// the smallest choice needs, when none does.
ActivationPolicy choose_activation_policy(const std::vector<std::vector<ActivationOption>>& options,
                                          double budget_bytes, const std::vector<HeldMoment>& moments = {{}},
                                          int64_t groups_in_flight = 2);

// Each share's choice (activation_shares), by pipeline rank; a refusal names the rank.
std::vector<ActivationPolicy> choose_activation_policies(const Config& config, const Layout& layout,
                                                         const BlockCosts& measured, bool cpu_device);

// The smallest a share's activations can be made (every block offloaded, whole or as the input
// it recomputes from, encoded where memory.activation_compression allows it, with the reserves),
// from the estimate alone: what `tessera inspect` and `--dry-run` check the budget against
// before anything is measured.
double smallest_activation_bytes(const Config& config, const ParallelDims& dims, const ActivationShare& share);

// Refuses, before anything is measured or started, a budget whose share for activations on some
// rank is smaller than the smallest policy needs, or (`device_capacity_bytes` > 0) larger than
// the device. Under a pipeline the cut is the one made without measurements (the run's profile
// cut may differ; its choice refuses by rank). Under memory.swap only the device's size: the swap
// plan shares the budget (plan/swap_policy.h refuses with it).
void check_activation_budget(const Config& config, const ParallelDims& dims, double device_capacity_bytes = 0);

// A table: each block's option, its bytes and seconds, and the totals against the budget.
std::string describe_activation_policy(const ActivationPolicy& policy);

// The same as JSON (`tessera bench --json`, `tessera plan --json`): each block's layer and option
// (its name, checkpointing, offload, codec, bytes, bytes awaiting W, seconds), the rank, the micro-batches held, the
// bytes against the budget, and the seconds the policy adds to a step of `micro_batches`.
nlohmann::json activation_policy_json(const ActivationPolicy& policy, int64_t micro_batches);

}  // namespace tessera
