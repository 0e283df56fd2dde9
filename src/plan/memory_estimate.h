// What a configured run holds per rank, computed from the model's own modules built on the meta
// device (nothing is allocated; model/parameter_census.h builds each stage once per process) and
// the layout (ParallelDims, ZeRO stage, offload, precision).
//
// Per parameter, from its declaration (model/parameter_spec.h): a split one (column, row, vocab)
// holds 1/tp of its elements on each tensor-parallel rank, an expert one 1/ep; replicated ones
// are whole. Then, over the R ranks holding a replica of it (R = dp x sp; an expert's dp x sp / ep):
//   parameters   P x bytes of the parameter dtype (fp32; fp16 with precision.dtype = fp16), /R at ZeRO-3
//   gradients    P x the same bytes, /R at ZeRO-2 and 3
//   optimizer    AdamW 8 bytes per element; SGD 4 with momentum, 0 without; Adafactor 4 x (n + m)
//                per [.., n, m] matrix row and column statistics (4 x numel for vectors) plus
//                4 x numel with beta1 > 0;
//                fp16 adds 4 bytes of fp32 master per element; /R at ZeRO 1-3; on the host with
//                parallel.offload (with a device copy of the gradient shard)
//   activations  per token per block, what tessera's block of that kind saves for its backward
//                (plan/activation_estimate.h: the norms, the attention's q, k, v and output and
//                the fused kernel's log-sum-exp, the MLP's or the experts' intermediates, the
//                dropout masks), split by tp (and Megatron-SP), over s / sp tokens per rank under
//                sequence parallelism; selective checkpointing drops the attention core's part,
//                full keeps the block input, and its backward holds one block's whole activations
//                beside them while it recomputes it (per micro-batch, not per token);
//                memory.activation_compression takes each element at
//                its encoding's bytes (bf16: 2 of float32's 4; int8, fp8: 1.125; adaptive:
//                memory.activation_bits / 8, the budget its choice holds);
//                memory.activation_offload moves the first blocks' to the host, leaving two of
//                them (of one micro-batch) in flight on the device. A pipeline rank holds the
//                micro-batches its schedule's simulation holds at its worst moment, those
//                awaiting their W counted with what their I kept less what it released
//                (awaiting_w_bytes_per_token); with memory.resident_micro_batches only that
//                many of those before their I, the others' in host memory with 2 + v block
//                groups in flight on the device (v: the rank's stages).
//   working      the backward's own tensors at its peak, beside the saved activations: the head's
//                logits and their gradients or the last block's MLP gradients, whichever phase
//                holds more (plan/activation_estimate.h, backward_working_bytes)
//   in flight    ZeRO-3: the units gathered whole at the backward's peak; without a pipeline the
//                ends (embeddings, final norm) in the head's phase, and in the block phase the
//                ends and three of the largest block (the one running, the next one prefetched,
//                and the full gradient of the one before, until its reduce-scatter): the phase
//                whose working set and gathered units hold more counts both; with a pipeline the
//                rank's whole stages (held for the step; three blocks with
//                parallel.zero3_reshard_per_microbatch); ZeRO-2 and 3 with several
//                micro-batches and no pipeline: the last two reduce-scatters of the micro-batch
//                before (the ends' and a block's full flat gradient and shard); with a pipeline,
//                which reduces every micro-batch, the largest of three moments of a backward (its
//                start with the backward before's last unit in flight, its first unit flattened,
//                its end with the micro-batch's activations gone: memory_estimate.cpp)
//   copies       precision.dtype = bf16: the bf16 copies of the float32 weights that autocast's
//                products (or model/linear.h's function) keep for their backward: 2 bytes per
//                parameter of the rank's stage that a product uses (the linears', the experts', the
//                head's: not the norms', the router's, the positions' nor a first stage's token
//                embedding, which a lookup reads; nor, under Megatron-SP with tp > 1, the
//                sequence-gathered input projections', which keep the float32 parameter; nor,
//                under ZeRO-3 without a pipeline, the blocks' products but the experts', which keep
//                the gathered float32 weights and cast them again in their backward:
//                model/linear.h's KeepFloatWeightsForBackward), whole even under ZeRO-3
//                otherwise: one set for the step (a pipeline step's micro-batches share one:
//                parallel/pipeline_step.h), but once per micro-batch the schedule holds under
//                ZeRO-3 in a pipeline
//   host         with parallel.offload, besides the optimizer state, the shard's float32 master
//                copy and its gradient: (4 + 4) / R bytes per parameter
// The peak is the larger of the backward's (parameters, optimizer state, activations, working,
// in flight, and the gradients where they exist by then: kept across steps by data parallelism's
// buffers and shards, or made by an earlier micro-batch of the step; under a pipeline the
// schedule's moments before the rank's first B or W, without gradients, and after it, with them,
// each with the micro-batches it holds then) and the optimizer step's
// (parameters, gradients, optimizer state). Not counted: the optimizer's own temporaries, the
// communication buckets' staging copies, pipeline transfers and the experts' dispatch buffers.
// Checked against the peak of tensor bytes of runs on this machine: bench/plan_memory_here.py,
// docs/plan.md.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/parallel_dims.h"
#include "plan/layout.h"
#include "config/config.h"

namespace tessera {

struct MemoryEstimate {
  int64_t parameters_total = 0;   // the whole model's parameter count
  std::map<std::string, int64_t> parameters_by_component;  // "embedding", "blocks", "final norm"
  int64_t parameters_rank = 0;    // elements this rank holds after tensor/expert parallelism
  double parameter_bytes = 0;     // per rank, on the device
  double gradient_bytes = 0;
  double optimizer_bytes = 0;     // on the device, or on the host with offload
  bool optimizer_on_host = false;
  double activation_bytes_per_token = 0;  // all of this rank's blocks, per token of its sequence chunk
  double activation_bytes_per_micro_batch = 0;  // x train.batch_size x (seq_len / sp)
  double activation_host_bytes = 0;  // memory.activation_offload: what waits in host memory at the peak
  double working_bytes = 0;          // the backward's working set (above), per rank
  double in_flight_bytes = 0;        // ZeRO-3's gathered units and ZeRO-2/3's reduce-scatters at the backward's peak
  double offload_host_bytes = 0;     // parallel.offload: the shard's master copy and gradient on the host
  double weight_copy_bytes = 0;      // bf16: the products' bf16 copies of the weights, kept for the backward
  bool gradients_at_peak = true;     // whether the gradients exist at the backward's peak (above)
  // With parallel.pp > 1: the pipeline rank these numbers are for (the one that needs the most),
  // the micro-batches' activations (x one stage) its schedule holds at its peak, which the
  // activation terms include, and the cut and schedule as text. pipeline_rank -1: no pipeline.
  int64_t pipeline_rank = -1;
  int64_t pipeline_held = 0;
  // The simulation's held micro-batches by how many await their W, before the rank's first
  // gradients and after (pipeline::Simulation::peak_held_awaiting_w_*); empty without a pipeline.
  std::vector<int64_t> pipeline_held_before_gradients, pipeline_held_with_gradients;
  std::string pipeline;
  // The device's peak: the larger of the backward's and the optimizer step's (above).
  double device_bytes() const;
  // The same without the working set and the units in flight, the terms that are approximate:
  // tensors that certainly exist at once.
  double device_lower_bound_bytes() const;
  // What the rank keeps in host memory: offloaded optimizer state, master copy and gradient, and
  // offloaded activations.
  double host_bytes() const;
};

// Estimates any layout (plan/layout.h); check_parallel_layout says whether it can run. With
// parallel.pp > 1 each pipeline rank holds the stages the layout gives it and the activations its
// schedule holds at its peak (parallel/pipeline/simulate.h), and the estimate is the largest rank's.
MemoryEstimate estimate_memory(const Config& config, const Layout& layout);
// Every pipeline rank's estimate, by pp rank (one without pipeline parallelism).
std::vector<MemoryEstimate> estimate_memory_by_rank(const Config& config, const Layout& layout);

// Bytes no rank of the layout holds fewer of (no table is built): the whole model's state on one
// tensor- and expert-parallel rank (parameters, gradients and the device's optimizer state, as
// ZeRO divides them over dp) shared evenly over the pipeline ranks; the largest rank holds at
// least the mean, and activations on top.
double model_state_lower_bound(const Config& config, const ParallelDims& dims);

// The model, the parameter count by component, the layout and the per-rank table, as lines of
// text (`tessera inspect`, `tessera train --dry-run`).
std::string describe_memory_estimate(const Config& config, const ParallelDims& dims, const MemoryEstimate& e);

// "124.48M", "174.60B", "812".
std::string format_count(int64_t n);

// Refuses, before anything is allocated, a run whose estimate cannot fit. On the CPU
// (`device_capacity_bytes` 0): when `ranks_on_host` ranks of `e` (device bytes, plus offloaded
// optimizer state) exceed `host_available_bytes`. On a GPU (`device_capacity_bytes` > 0, the
// device's total memory, checked by each worker once its device is chosen): when one rank's device
// bytes exceed it, and offloaded optimizer state x `ranks_on_host` exceeds the host's. The message
// names the largest term and the keys that set it. It refuses by device_lower_bound_bytes (no
// working set, no units in flight, no allocator slack, CUDA context or libtorch's own memory), so
// what passes may still not fit; what is refused cannot. A capacity <= 0 is unknown: nothing is
// refused for it.
void check_memory_fits(const Config& config, const MemoryEstimate& e, int64_t ranks_on_host,
                       double host_available_bytes, double device_capacity_bytes = 0);

// MemAvailable of /proc/meminfo in bytes (0 when unreadable: then nothing is refused).
double host_memory_available();

}  // namespace tessera
