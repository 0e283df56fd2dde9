// Causal ring attention: softmax-attention sequence parallelism by passing key/value blocks
// around the sp ranks (Liu et al., arXiv 2310.01889; papers.md §2.3).
//
// Rank t of the sp group (W ranks) holds tokens [t C, (t+1) C) of every sequence: Q_t, K_t, V_t
// [B, H, C, d]. Query block t attends to key blocks s <= t only (causality): block t itself with
// the causal mask, blocks s < t in full. Later blocks are never sent where they are not needed.
//
// Forward on rank t, steps i = 0..t (block s = t - i is held at step i; i = 0 is its own):
//   start  send (K_s, V_s) -> t+1 (t < W-1), recv (K_{s-1}, V_{s-1}) <- t-1 (i < t)   on a thread
//   scores = Q_t K_s^T / sqrt(d)  (masked above the diagonal when s = t), float32
//   online softmax: m' = max(m, rowmax scores); acc = acc e^{m-m'} + e^{scores-m'} V_s;
//                   l = l e^{m-m'} + rowsum e^{scores-m'}                     (m, l, acc float32)
//   wait for the exchange
//   O_t = acc / l,  lse_t = m + log l  (saved with Q, K, V, O for backward)
// Every block is sent by the ranks between its owner and the last rank: rank t sends blocks
// 0..t on to t+1, and the last rank sends none.
//
// Backward: the standard ring-attention backward with a custom autograd function. It recomputes
// the probabilities per block from the saved log-sum-exp instead of keeping any received block:
//   D = rowsum(dO ∘ O);  per block s <= t: P = exp(scores - lse), dV_s += P^T dO,
//   dS = P ∘ (dO V_s^T - D), dQ_t += dS K_s / sqrt(d), dK_s += dS^T Q_t / sqrt(d).
// K/V blocks travel again exactly as in forward; the accumulator (dK_s, dV_s) (float32) travels
// with its block and then on around the ring: at each of W steps every rank adds its part to
// the accumulator it holds and passes it to t+1 (overlapped with the next step's compute); after
// W steps rank t holds its own block's dK_t, dV_t, summed over the ranks t..W-1 that used it.
//
// Bytes sent by rank t per layer (e = bytes per element of q, k, v; block = B H C d elements):
//   forward   2 (t+1) block e  for t < W-1, 0 for the last rank         (K and V of blocks 0..t)
//   backward  2 (t+1) block e  (the same K/V) [t < W-1]  +  2 W block 4  (the dK, dV accumulators)
// With block = B H T d / W: at most (4 e (W-1)/W + 8) B H T d bytes on one rank (rank W-2), which
// does not shrink with W, against Ulysses' 8 e (W-1)/W^2 B H T d (ulysses.h).
//
// Invariants: every rank of `sp` calls ring_attention for the same layers in the same order with
// equal C (it is a collective); no dropout. Outputs and gradients equal causal SDPA on the whole
// sequence to float32 rounding (tests/distributed/sequence/test_softmax_sp.cpp). Compute is unbalanced by
// construction (rank t computes t+1 blocks), the price of contiguous chunks.
#pragma once

#include <ATen/core/Tensor.h>

#include "comm/group.h"

namespace tessera {

// q, k, v: [B, H, C, d], this rank's chunk of the sequence; returns this chunk's causal softmax
// attention [B, H, C, d] (scale 1/sqrt(d)) in q's dtype, differentiable in q, k, v.
at::Tensor ring_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, comm::Group& sp);

}  // namespace tessera
