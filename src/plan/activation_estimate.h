// What one block saves for its backward, per token of this rank's sequence chunk: the activation
// term of the memory estimate (plan/memory_estimate.h), counted as tessera's blocks save it. The
// measurement it follows is autograd's saved tensors (memory/saved_activations.h, `tessera bench
// --json`'s saved_activation_bytes; docs/memory.md). In elements of the compute dtype (at the
// activation codec's bytes per element) unless said:
//
//   norms      both norms' inputs (the residual stream) and outputs: 4h (RMSNorm as model/
//              rms_norm.h's function keeps it; ATen's composite keeps a normalised copy more); their statistics
//              (LayerNorm's mean and rstd, RMSNorm's rstd) in float32, never encoded
//   attention  softmax: q, k and v (h_q + 2 kv, kv = kv_heads x head_width); with rotary positions
//              the rotated q and k again (h_q + kv); with fewer key/value heads than query heads
//              under sequence parallelism's ring and Ulysses kernels (and on a GPU, not measured)
//              k and v expanded to every head (2 h_q; the CPU's SDPA keeps them as they are); the
//              output (h_q); the fused kernel's
//              log-sum-exp, one float32 per head (SDPA keeps no scores, on CUDA or the CPU)
//              linear (lightning, model/linear_attention.cpp): the SiLU inputs of q and k, q, k,
//              v, each chunk's decayed scores (a c, c the chunk), the decayed q and k, the state
//              entering each chunk (a d^2 / c), the output, its normalised copy, its gate and
//              their product: 11 h + a c + a d^2 / c
//   MLP        GELU: its input and output (2f); SwiGLU: the joined up and gate, and their
//              product (3f: the gate is one function, model/swiglu.h)
//   MoE        per token top_k x capacity_factor slots (top_k dropless) of an expert's input (h),
//              MLP (above, at the expert's width) and output (h); the router's logits and
//              probabilities (2 E); each shared expert's input, MLP and output
//   dropout    with model.dropout > 0, the residual branches' two masks (bool: a byte per element,
//              a bit under any activation codec)
// Tensor parallelism splits everything but the norms' 4h and statistics; Megatron-SP splits those
// too (the column-parallel products keep their input before its all-gather:
// parallel/tensor/tp_comm.h, sequence_gathered_linear), but for lightning attention, whose four
// projections keep the gathered input (h whole); sequence parallelism is in "per token of this rank's chunk". Selective
// checkpointing drops the log-sum-exp (the attention core's); full keeps the block's input (h).
#pragma once

#include <cstdint>
#include <vector>

#include "config/config.h"
#include "core/parallel_dims.h"
#include "memory/activation_codec.h"

namespace tessera {

// Bytes of one element of the compute dtype (autocast's under bf16, else the parameters': 2 under
// bf16 and fp16, 4 under fp32), and of one parameter (precision/precision_options.h).
double compute_element_bytes(const Config& config);
double parameter_element_bytes(const Config& config);

// The codec every block applies: memory.activation_compression, except under memory.activation_policy
// = auto, where it is one of the policy's choices per block (plan/activation_policy.h) and the
// estimate counts every block uncompressed, and under adaptive, whose tensors are kept, int8 or
// int4 (memory/adaptive_codecs.h): int8, the rate its encoding is priced at; its bytes are
// memory.activation_bits' (activation_element_bytes).
ActivationCodec applied_activation_codec(const Config& config);

// The codecs whose encoding rate the activation policy prices: the ones memory.activation_compression
// allows it, and memory.attention_compression's (none and lossless never: they encode nothing).
std::vector<ActivationCodec> encoding_codecs(const Config& config);

// What one activation element takes under the run's precision (16-bit under bf16 and fp16) and
// the applied codec; under adaptive memory.activation_bits / 8, at most the element's own bytes.
double activation_element_bytes(const Config& config);

// Bytes per token block `layer` saves; `element_bytes`: what one activation element takes (the
// dtype's, or the activation codec's encoding of it), but for the attention core's elements under
// memory.attention_compression, at that codec's.
double block_activation_bytes_per_token(const Config& config, const ParallelDims& dims, int64_t layer,
                                        double element_bytes);
// The float32 statistics among them (the norms', the softmax core's log-sum-exp): off the
// gradient's path, never encoded, and what stays on the device when the block's activations are
// offloaded (memory/activation_offload.h). Per token, and per micro-batch under the config's
// checkpointing (none under full).
double block_statistics_bytes_per_token(const Config& config, const ParallelDims& dims);
double block_statistics_bytes(const Config& config, const ParallelDims& dims);

// The elements per token of this rank that block_activation_bytes_per_token counts inside the
// attention core (CausalSelfAttention::core, LinearAttention::core: memory.attention_compression's
// tensors, memory/saved_activations.h): in the compute dtype, and in float32 on the CPU's math path
// of softmax attention; as saved under `codec` (one that keeps tensors whole keeps the input
// projection's whole output beside a rotary core's rotated q and k). None under selective or full
// checkpointing, which recompute the core.
struct AttentionCoreElements {
  double compute = 0;
  double float32 = 0;
};
AttentionCoreElements attention_core_elements_per_token(const Config& config, const ParallelDims& dims,
                                                        ActivationCodec codec);
// Whether `codec` keeps a saved tensor as it is, its whole storage held (none, lossless).
bool keeps_storages_whole(ActivationCodec codec);

// What block `layer` saves per micro-batch on this rank (train.batch_size x its share of the
// sequence) under the config's checkpointing and compression.
double block_activation_bytes(const Config& config, const ParallelDims& dims, int64_t layer);

// What block `layer` holds while its backward recomputes it under memory.activation_checkpointing
// = full: its whole activations, as the block saves them without checkpointing (under the
// config's codec). One block is recomputed at a time, so the largest is the working set a budget
// must leave for it (a swap plan's reserve, plan/swap_cut.h).
double recomputed_block_bytes(const Config& config, const ParallelDims& dims, int64_t layer);

// What a micro-batch of block `layer` holds per token while it awaits its W in a zero-bubble
// schedule, beyond what its forward saved: `kept`, the output gradients its I kept at the
// parameterised products and norms (parallel/pipeline/split_backward.h): the attention's input
// and output projections (h_q + 2 kv, h; the linear kind's five projections, 5h), the MLP's (f, or
// SwiGLU's 2f, and h; MoE: per slot), both norms' (2h); less `released`, what the input path's
// other nodes saved, which the split releases after I: the attention core's q, k and v (with
// rotary's inputs and grouped-query expansion), GELU's input (SwiGLU's joined up and gate: 2f),
// counted uncompressed. In the compute dtype; split by tp as the products are (the norms' under
// Megatron-SP). Measured (tessera bench, pp2 zbh1 on tiny_gpt's shapes, a per-action trace of the
// tensor bytes): F adds 8.5 MiB a micro-batch, its I 2.5 MiB more (6.0 before the release), its W
// frees both; extra() says 2.0.
struct AwaitingW {
  double kept = 0, released = 0;
  double extra() const { return kept - released; }  // may be negative
};
AwaitingW awaiting_w_bytes_per_token(const Config& config, const ParallelDims& dims, int64_t layer);

// What a pipeline rank holds per token of a micro-batch beside its blocks' saved activations, from
// the micro-batch's F to its B (or I), at the compute dtype's bytes (neither is inside a block's
// saved-tensor scope, so no codec packs them):
//   output  a stage that sends its output keeps it: the stage's caller holds it as the root of the
//           micro-batch's backward (and the asynchronous send its buffer, the same storage): h per
//           token, h / tp under Megatron-SP
//   head    the head's saved tensors: the final norm's input and output and the log-probabilities
//           (2h + V; under tp the vocabulary-parallel loss's float32 softmax of V / tp, and under
//           Megatron-SP the norm's input split, h / tp, and the product's input gathered, h), for
//           every micro-batch held but the one whose backward the working set counts
// Found 2026-12-02 on tiny_gpt pp2 GPipe (h 256, 8 blocks, 2 x 128 tokens a micro-batch) at 4, 8
// and 12 micro-batches: the ranks' measured peaks rose by a constant step a micro-batch, rank 0's
// 0.25 MiB and the head rank's 0.75 MiB over the blocks' estimate at V = 256, 1.25 MiB at V = 768.
struct PipelineHeld {
  double output = 0, head = 0;
};
PipelineHeld pipeline_held_bytes_per_token(const Config& config, const ParallelDims& dims);

// The backward's working set per micro-batch on a rank holding the head and/or blocks: the
// tensors that exist beside the saved activations and the optimizer state at the backward's peak,
// which comes near its start, in the first (the head's) or second (the last block's) of two
// phases:
//   head   the final norm's input and output (2h, saved for its backward and the output matmul)
//          and the logits' tensors: the log-probabilities and the gradients of both (3 V per
//          token; model/cross_entropy.h; the step drops the logits themselves before the
//          backward, parallel/plain_step.cpp), or on a GPU in 16-bit precision the fused loss's
//          logits and gradient (2 V); and the output matrix's gradient (V x h at the
//          parameters' bytes). Under tp the vocabulary-parallel loss (parallel/tensor/
//          vocab_parallel.cpp) on V / tp columns instead, whose peak can be its forward's, the
//          activations all held there too: the logits, their float32 copy (under a 16-bit dtype),
//          the shifted logits and their exponentials (float32); or its backward's: the kept
//          softmax, its gradient and that gradient's cast (16-bit), and the output matrix's
//          gradient (found on a tp2 row whose peak a backtrace put in that forward, 2026-12-01)
//   block  the gradient of the residual stream, twice (2h; split by tp under Megatron-SP, where
//          the column product's input, gathered again, and its input gradient add 2h whole), and of
//          the MLP's hidden activation, once (GELU) or twice (SwiGLU's gate and up) per token,
//          split by tp (MoE: the top-k x capacity slots per token at the expert's width); the
//          down-projection's weight gradient (f x h / tp) and, on the head's rank, the head's,
//          made at the start of the backward and not yet reduced
// Each phase's (0 where the rank has no head, or no blocks); the larger is the working set beside
// which nothing else differs by phase (the memory estimate adds ZeRO-3's gathered units, which do).
// Measured as `tessera bench`'s peak_bytes less its model state and its blocks' saved activations
// on five tiny_gpt shapes (h 128-512, V 256-1024, 512 or 1024 tokens, one process, one
// micro-batch); bench/plan_memory_here.py checks it inside whole runs of 22 layouts (docs/plan.md).
struct BackwardWorkingSet {
  double head = 0, block = 0;
  double larger() const { return head > block ? head : block; }
};
BackwardWorkingSet backward_working_bytes(const Config& config, const ParallelDims& dims, bool has_head,
                                          bool has_blocks);

}  // namespace tessera
