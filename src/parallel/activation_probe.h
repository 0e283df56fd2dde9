// The probe of memory.activation_compression = adaptive (memory/adaptive_codecs.h): how far
// rounding each tensor a block saves to int4 moves the gradients, measured on this rank's model and
// one micro-batch, and the codecs chosen from it.
//
//   1. The census: the model's loss on the micro-batch with every slot at int4, its backward by
//      torch::autograd::grad over the first block's input (census_backward; through a pipeline,
//      each stage's over its input: no parameter's gradient is made):
//      nothing accumulates into .grad and no post-accumulate hook fires, so the step's owner
//      (DataParallel's buckets) never sees the probe. It records each block's slots, its input, the
//      random streams' states it started from, its output and the gradient that reaches its output
//      (through the blocks after it at int4: their rounding is in it, as it is in the gradient a
//      step under the chosen table brings them).
//   2. Each block alone, from its recorded input and streams (its dropout draws the census's
//      masks), backward from the recorded output gradient to that input and the block's
//      parameters: once with every slot kept (the reference, whose output must match the census's
//      to 1e-4 of its largest magnitude, or the probe stops), then once per slot with that slot
//      alone int4. The slot's error is the squared distance of those gradients from the
//      reference's, summed in float64.
//   The streams end as the probe found them: the step after it draws what it would have drawn.
//   3. choose_slot_codecs within `bits` an element.
//
// The measure is local to a block (an error in its input's gradient is counted there, not followed
// through the blocks before it), as GACT's is per tensor. It costs one forward and backward of the
// model and, per block, one of the block for each of its slots and one more. It holds at most the
// census's activations at int4 or one block's kept (its reference pass), with the records: never
// the whole model's kept, which a step at the budget is meant not to need. The blocks run as a
// step runs them (training mode, dropout included; the layouts are those config.cpp's
// check_adaptive_codecs lets through). choose_activation_codecs runs it on rank 0 of the data
// replicas and hands the table to the others.
//
// Under tensor parallelism every rank of the tp group probes at once (the blocks' collectives run
// in both passes) and the errors count as the clipping norm counts a gradient (ActivationProbing): a
// parameter every rank holds weighs 1/tp (ModelParallelNorm), a share of one (Megatron-SP's norm
// weights, GradientShares) is summed over its group first, the block input's gradient weighs 1/tp
// where every rank holds it whole (tp without Megatron-SP); the errors are then summed over the tp
// group. The budget counts the elements as one process holds them: a slot every tp rank saved
// alike (the same sum of elements on each; tp without Megatron-SP keeps the norms' inputs and
// outputs whole) once, any other over all the ranks (key and value heads replicated on some ranks
// only are counted as split). So every rank chooses the same table, the one a single process
// chooses up to the order of its sums; a rank's own bits an element may then differ from the
// budget, its replicated tensors weighing more among its own than among the whole model's.
//
// Under sequence parallelism (ring, Ulysses, LASP) every rank of the sp group probes at once too,
// each on its chunk of the same sequences: a parameter gradient is the sum of the ranks' shares,
// so the differences from the reference are summed over the group before their squares (one
// collective per probed slot: the whole gradient's error, equal on every rank); the block input's
// gradient is split by position, so its squares are summed over the group. The budget counts the
// elements group by group: over the sp group's ranks unless alike on each, then over the tp
// group's unless alike on each (under tp without Megatron-SP a norm's input is whole on the tp
// ranks and split over the sp ranks: counted sp times).
//
// Under expert parallelism (with data parallelism alone) every rank of the ep group probes at
// once, each on the micro-batch of the group's rank 0 (the step runner sends it), so that the
// experts' all-to-alls run in both passes and every rank computes one process's values: its
// gradients are one process's but for its experts', which sum the ep copies of each token routed
// to them (ep times one process's; their squared differences ep^2 times). The errors weigh
// 1/ep^2 for an expert's parameter, 1/ep for any other and for the block input's gradient, and
// are summed over the group; each slot's elements are summed over the group and divided by ep
// (every rank's share of the copies), so every rank chooses one process's table.
//
// MoE blocks with model.moe_aux_scope = global sum their balance counts over dp_sp: every rank of
// it probes its own micro-batch, the group taking the sequence group's part above (their
// micro-batches one, as one process would probe them merged). Elsewhere the probe takes the
// count sums out while it runs (its collective would wait for ranks that do not probe), and no
// forward of the probe counts into the layers' statistics (moe.h).
//
// Under ZeRO-3 and swap a block's parameters are whole only around its use: the caller's census
// brings them in around each pass (ZeRO-3's wrappers inside the owner's run_probe, every replica
// probing rank 0's micro-batch; SwapStep sub-model by sub-model), and ActivationProbing's
// around_block around each block's own passes.
//
// Under pipeline parallelism the census is micro-batch 0 through every stage and back (the
// caller's census runs pipeline::census_schedule through the executor); each rank then probes the
// blocks of its stages (with its tp and sp groups as above), and every rank of the pp group
// gathers every stage's slots and errors, so all choose one table for the whole model within one
// budget, as one process would.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include <ATen/core/Tensor.h>

#include "comm/group.h"
#include "memory/adaptive_codecs.h"
#include "model/transformer.h"
#include "parallel/tensor/gradient_shares.h"
#include "protocols/optimizer_owner.h"

namespace tessera {

// Where and how the probe runs (above); the default: one rank holds the whole model.
struct ActivationProbing {
  comm::Group* replicas = nullptr;  // rank 0 probes and broadcasts the table over them; null: alone
  int64_t every = 0;                // steps between probes (memory.activation_probe_every; 0: the first step only)
  ModelParallelNorm norm;           // the clipping norm's weights (its groups are not the probe's)
  GradientShares shares;            // gradients that are shares over a tp group
  double input_weight = 1;          // a block input gradient's weight: 1/tp where every tp rank holds it
  comm::Group* tensor = nullptr;    // the tp group, whose ranks probe together
  comm::Group* sequence = nullptr;  // the sp group (or dp_sp: MoE global balance), whose ranks probe together
  comm::Group* pipeline = nullptr;  // the pp group, whose ranks probe their stages together
  comm::Group* experts = nullptr;   // the ep group, whose ranks probe its rank 0's micro-batch together
  // Runs a block's passes with its parameters whole (ResidentOwner::run_probe's; unset: as they are).
  ResidentOwner::AroundBlock around_block;
};

struct ActivationProbe {
  BlockSlots slots;
  SlotErrors int4_error;
  SlotCodecs codecs;
  double seconds = 0;
};

// `census`: the model's forward and backward on the micro-batch (census_backward where this
// process computes the whole loss); `run_block`: a block's forward as the step runs it (under
// autocast). Leaves `codecs` applying the choice.
ActivationProbe probe_activation_codecs(TransformerLM& model, AdaptiveCodecs& codecs, const std::function<void()>& census,
                                        const std::function<at::Tensor(Block&, const at::Tensor&)>& run_block,
                                        const ActivationProbing& probing = {});

// The census's backward of a whole model's `loss`: its gradient with respect to the input of the
// census's first block (AdaptiveCodecs::census_input), taken and dropped, so that every block's
// backward runs and no parameter's gradient is made.
void census_backward(TransformerLM& model, const at::Tensor& loss);

// Whether a step runner probes before its step `steps_run` (0: the first).
bool probes_before(const ActivationProbing& probing, int64_t steps_run);

// The probe on rank 0 of probing.replicas (with its model-parallel groups), each block run as the
// step runs it (under `autocast` when set), its table then broadcast over the replicas (each
// receiving the codecs of `model`'s blocks) and applied. Returns the prober's line
// (describe_activation_codecs), nothing elsewhere.
std::optional<std::string> choose_activation_codecs(TransformerLM& model, const ActivationProbing& probing,
                                                    c10::Device device, std::optional<at::ScalarType> autocast,
                                                    const std::function<void()>& census);

// The line `tessera train` prints after a probe: the budget, the counts and bits chosen, the
// probe's time, each block's slots in order (k kept, 8 int8, 4 int4), and the autograd node that
// made each of the first block's.
std::string describe_activation_codecs(const BlockSlots& slots, const SlotCodecs& codecs, double bits, double seconds);

}  // namespace tessera
