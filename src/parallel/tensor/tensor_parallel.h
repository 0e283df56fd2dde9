// Megatron tensor parallelism applied from outside to a single-device TransformerLM (Shoeybi et
// al., arXiv 1909.08053; sequence parallelism: Korthikanti et al., arXiv 2205.05198; papers.md).
//
// parallelize_tensor shards the model's parameters in place over the tensor-parallel group (N
// ranks, this rank r) as each module declares them (model/parameter_spec.h: column, row, vocab,
// replicated) and installs the communication through the model's hook points
// (model/sharded_region.h, TransformerLMImpl::set_shard_hooks). It is one step of parallelize()
// (parallel/parallelize.h), which runs check_tensor_parallel() first. Per block, with C = n_embd,
// H = n_head, d = C / H, F = MLP hidden width:
//
//   layer            parameter           split                          communication (fwd / bwd)
//   attention (gpt)  c_attn [3C, C]      rows: the q, k, v rows of      enter: copy_to_tp
//                                        heads [r H/N, (r+1) H/N)              (identity / all-reduce)
//                    c_proj [C, C]       columns of those heads; bias   exit: reduce_from_tp
//                                        replicated, added after exit          (all-reduce / identity)
//   attention        q_proj [H d, C]     rows of this rank's heads      as gpt
//   (llama, qwen)    kv_proj [2 K d, C]  the k, v rows of its K / N
//                                        heads; with K < N, of head
//                                        r / (N / K), held by N / K
//                                        ranks, its gradient a share
//                                        summed once a step over only
//                                        them (kv_replica_ranks;
//                                        gradient_shares.h)
//   attention        q, k, v, u_proj     rows of this rank's heads;     as gpt; the decays λ_h of
//   (linear)         o_proj              columns; bias replicated       the rank's heads are kept
//   MLP              c_fc [F or 2F, C]   rows (GLU: a rows, g rows)     enter / exit as attention
//                    c_proj [C, F]       columns; bias replicated
//   embedding        wte [V, C]          rows [r V/N, (r+1) V/N)        vocab_parallel_embedding:
//                                                                        all-reduce / none
//   head (tied)      wte                 (the same rows)                copy_to_tp on ln_f's output;
//                                                                        logits [B, T, V/N]
//   loss                                                                 vocab_parallel_cross_entropy
//   LayerNorms, wpe  replicated
//
// With megatron_sp (Megatron sequence parallelism) the LayerNorm / dropout / residual region
// holds tokens [r T/N, (r+1) T/N) of each sequence: the embedding's sum is split along the
// sequence (scatter_to_sequence; backward all-gather), enter becomes gather_from_sequence
// (all-gather / reduce-scatter), exit reduce_scatter_to_sequence (reduce-scatter / all-gather), and
// the head gathers ln_f's output along the sequence. A layer sends the same bytes as without it
// (an all-reduce is a reduce-scatter plus an all-gather); the activations of that region take 1/N
// of the memory. Each replicated parameter used inside the
// region (ln_1, ln_2, ln_f, the row-parallel biases) then sees only this rank's tokens: its .grad
// after backward is this rank's share, summed over tp once a step by the optimizer owner
// (gradient_shares.h), as are per-head parameters' (Qwen 3's q/k norms) with or without it.
//
// The caller's contract (the training step):
// - every rank of tp runs the same batch (the same idx and targets) through forward and backward;
//   under megatron_sp the sequence length must be a multiple of N (checked at forward);
// - the loss is the same on every tp rank; each rank's backward gives every parameter it holds its
//   exact gradient (the slice of the single-device gradient for split parameters, the full
//   gradient, identical on all tp ranks, for replicated ones) but the shares (gradient_shares.h:
//   those above, and replicated key/value heads'), which the step sums once after its last
//   backward (GradientShares::sum; the optimizer owners do); gradients are reduced over dp as
//   usual, before or after that sum;
// - logits are this rank's vocabulary columns [B, T, V/N] (gather_from_tp gives all of them);
// - `tp` outlives the model's use; every rank calls parallelize_tensor with equal arguments.
// An MoE layer is not split: it runs whole on every tp rank, on the replicated input (its experts
// split by expert parallelism, parallel/expert/expert_parallel.h, if at all).
// check_tensor_parallel refuses, naming the keys: model.ffn = moe with parallel.megatron_sp (a rank
// would route its sequence chunk alone), model.n_head or model.vocab_size not a multiple of parallel.tp,
// model.n_kv_head neither a multiple nor a divisor of it, parallel.megatron_sp with tp = 1 or with parallel.sp > 1, a sequence
// length Megatron-SP cannot split, optim.name = adafactor (it factors whole rows and columns).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "comm/group.h"
#include "core/parallel_dims.h"
#include "core/parallel_options.h"
#include "model/transformer.h"

namespace tessera {

// Refuses what tensor parallelism cannot run (see above), naming the keys; called by the layout
// validator (parallel/parallelize.h). `seq_len`: train.seq_len; `optimizer`: optim.name.
void check_tensor_parallel(const ModelOptions& model, const ParallelOptions& parallel, const ParallelDims& dims,
                           int64_t seq_len, const std::string& optimizer);

// Shards `model` in place for the ranks of `tp` (see above). With tp.size() == 1 it does nothing.
void parallelize_tensor(TransformerLM& model, comm::Group& tp, bool megatron_sp);

// The global ranks of tp that hold the same key/value heads as this rank (consecutive tp ranks,
// N / K of them where K < N key/value heads), or empty where every rank holds its own.
std::vector<int64_t> kv_replica_ranks(const TransformerLM& model, const comm::Group& tp);

// How a parameter (or a tensor of its shape, such as an optimizer moment) is split.
struct TensorParallelLayout {
  int64_t dim = -1;   // -1: replicated; otherwise split along this dimension
  int64_t parts = 1;  // the dimension is `parts` equal blocks (c_attn: q, k, v; GLU c_fc: a, g),
                      // each split into N / replicas chunks; rank r holds chunk r / replicas of
                      // every block, in order
  int64_t replicas = 1;  // consecutive ranks holding the same chunk (kv heads fewer than N: N / K)
  int64_t chunk(int64_t rank) const { return rank / replicas; }
  int64_t chunks(int64_t ranks) const { return ranks / replicas; }
};

// The layout of a parameter under tensor parallelism over `ranks` ranks, from its declaration.
TensorParallelLayout tensor_parallel_layout(const ParameterSpec& spec, int64_t ranks);

// Rank `rank` of `ranks`'s part of a full tensor.
at::Tensor shard_tensor(const at::Tensor& full, const TensorParallelLayout& layout, int64_t rank, int64_t ranks);

// The full tensor from every rank's part (a collective of tp; the inverse of shard_tensor).
at::Tensor gather_tensor(const at::Tensor& part, const TensorParallelLayout& layout, comm::Group& tp);

}  // namespace tessera
