// DeepSpeed-Ulysses: softmax-attention sequence parallelism by all-to-all (Jacobs et al., arXiv
// 2309.14509; papers.md §2.3).
//
// Rank t of the sp group (W ranks) holds tokens [t C, (t+1) C) of every sequence, C = T / W. The
// attention of a head needs the whole sequence, so Ulysses trades the sequence split for a head
// split around the attention, per layer:
//
//   q, k, v  [B, H, C, d]  (sequence-sharded)
//     -> one all-to-all of the stacked q, k, v      [3, B, H/W, T, d]   (head-sharded: heads
//        [t H/W, (t+1) H/W) of the whole sequence)
//   y = SDPA(q, k, v, causal)                        [B, H/W, T, d]      (no communication)
//     -> one all-to-all back                         [B, H, C, d]
//
// Backward is autograd's: each all-to-all is an autograd function whose backward is the inverse
// all-to-all of the gradient (dy sequence -> heads, then dq, dk, dv heads -> sequence), and SDPA's
// backward runs locally on the head shard.
//
// Bytes sent per rank and layer (e = bytes per element, all-to-all sends (W-1)/W of its input):
//   forward  (3 + 1) B H C d e (W-1)/W      (q, k, v stacked; then y)
//   backward (1 + 3) B H C d e (W-1)/W      (dy; then dq, dk, dv stacked)
//   total    8 B H C d e (W-1)/W = 8 B H T d e (W-1)/W^2
// in 4 collectives of 2 (W-1) parallel steps each, the same volume as the 4 all-to-alls of q, k,
// v, y per direction of the paper with half the latency.
//
// Invariants: every rank of `sp` calls ulysses_attention for the same layers in the same order with
// equal C (it is a collective); H is a multiple of W; no dropout on the attention probabilities.
// Outputs and gradients equal causal SDPA on the whole sequence to float32 rounding
// (tests/distributed/sequence/test_softmax_sp.cpp).
#pragma once

#include <ATen/core/Tensor.h>

#include "comm/group.h"

namespace tessera {

// q, k, v: [B, H, C, d], this rank's chunk of the sequence; returns this chunk's causal softmax
// attention [B, H, C, d] (scale 1/sqrt(d)), differentiable in q, k, v. Throws naming model.n_head
// and parallel.sp when H is not a multiple of sp.size().
at::Tensor ulysses_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, comm::Group& sp);

}  // namespace tessera
