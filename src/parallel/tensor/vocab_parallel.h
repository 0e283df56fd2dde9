// Vocabulary-parallel embedding and cross-entropy (Megatron-LM, Shoeybi et al. §3): the tied
// token embedding wte [V, C] is split by rows over the tensor-parallel group (N ranks), so no rank
// holds the whole table or the whole logits.
//
// Rank r holds rows [r V/N, (r+1) V/N) (vocab_shard). V must be a multiple of N.
//
// Embedding: e = reduce_from_tp(lookup), where lookup puts row id - r V/N of the local table at
// the positions whose id lies in this rank's range and zero elsewhere. Every id is in exactly one
// rank's range, so the sum over ranks is wte[id]. Forward one all-reduce of [B, T, C]; backward
// none (the gradient of the local rows is computed locally).
//
// Head: local logits [B, T, V/N] = h wte_local^T (the caller applies copy_to_tp to h).
//
// Cross-entropy from local logits z (rows i = positions, local columns j), float32:
//   m_i     = max over ranks of max_j z_ij                       all-reduce (max)
//   s_i     = Σ over ranks Σ_j exp(z_ij - m_i)                   one all-reduce (sum) of s and t
//   t_i     = z_i,target_i - m_i on the rank holding target_i, 0 elsewhere
//   loss    = mean over i with target_i != ignore_index of log(s_i) - t_i
// Backward (no communication): dL/dz_ij = (exp(z_ij - m_i) / s_i - [j is target_i]) * g / count
// on the rows with a target, 0 on ignored rows; g the incoming gradient, count the targets.
// The loss is the same on every rank; each rank's backward gives its own columns' gradient.
// Bytes per rank: 2(N-1)/N of 4 bytes * positions (max), then of 8 bytes * positions (s, t).
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "comm/group.h"

namespace tessera {

struct VocabShard {
  int64_t start = 0;  // first row (token id) held by this rank
  int64_t size = 0;   // rows held: V / N
};

// This rank's rows of a vocabulary of vocab_size tokens; throws naming model.vocab_size and
// parallel.tp when vocab_size is not a multiple of tp.size().
VocabShard vocab_shard(int64_t vocab_size, comm::Group& tp);

// idx [B, T] int64 token ids in [0, V); weight [V/N, C], this rank's rows -> wte[idx] [B, T, C],
// differentiable in weight (only the local rows receive gradient).
at::Tensor vocab_parallel_embedding(const at::Tensor& idx, const at::Tensor& weight, comm::Group& tp);

// logits [..., V/N], this rank's columns; targets [...] int64 global ids or ignore_index -> the
// mean cross-entropy over the non-ignored positions, a float32 scalar equal on every rank
// (NaN when every target is ignored, as at::cross_entropy), differentiable in logits.
at::Tensor vocab_parallel_cross_entropy(const at::Tensor& logits, const at::Tensor& targets, comm::Group& tp,
                                        int64_t ignore_index = -1);

}  // namespace tessera
