// LASP: linear-attention sequence parallelism (Sun et al., arXiv 2404.02882; papers.md §2.2-2.4).
//
// The sequence of every layer is cut into contiguous chunks, chunk t on rank t of the sp group.
// Causal linear attention with decay (model/linear_attention.h) only needs, from all earlier
// tokens, their KV state S [B, H, d_k, d_v] decayed to the chunk's first position, so:
//
// ring (LASP-1), forward on rank t:
//   S_in  = recv(t - 1)                  (zeros on rank 0)
//   O     = lightning_attention_chunked(Q, K, V, λ, chunk, S_in)     intra + inter, S_out
//   send(S_out -> t + 1)
// backward on rank t, the ring reversed:
//   dS_out = recv(t + 1)                 (zeros on the last rank)
//   dQ, dK, dV, dS_in = the local chunk's vector-Jacobian product for (dO, dS_out)
//   send(dS_in -> t - 1)
// allgather (LASP-2), forward: every rank computes its chunk's own state M_t (S_out from zero),
// one all-gather of all M, then S_in = Σ_{s<t} λ^{C (t-1-s)} M_s locally (C = chunk length);
// backward: every rank computes dS_in from dO alone, one all-gather, then
// dS_out = Σ_{s>t} λ^{C (s-1-t)} dS_in_s locally.
//
// Both send B H d_k d_v float32 numbers per message, independent of the sequence length: the ring
// W-1 sequential steps each way per layer, LASP-2 one all-gather each way (parallel steps).
//
// KV-state caching: forward keeps S_in and the local chunk's autograd graph (built on detached
// inputs), so backward neither recomputes the forward nor receives S_in again.
//
// Invariants: every rank of `sp` calls lasp_attention for the same layers in the same order with
// equal chunk lengths (it is a collective); rank t of `sp` holds tokens [t T_c, (t+1) T_c) of each
// sequence. Outputs and gradients equal lightning_attention_chunked on the whole sequence to
// float32 rounding (tests/distributed/sequence/test_lasp.cpp). λ gets no gradient (it is fixed by the slopes).
#pragma once

#include <cstdint>
#include <string>

#include <ATen/core/Tensor.h>

#include "comm/group.h"
#include "model/transformer.h"

namespace tessera {

enum class LaspVariant { ring, allgather };

// "lasp" -> ring, "lasp2" -> allgather; throws naming parallel.sp_method otherwise.
LaspVariant lasp_variant(const std::string& sp_method);

// q, k: [B, H, T_c, d_k]; v: [B, H, T_c, d_v]; decay: [H] (λ); this rank's chunk of the sequence.
// Returns this chunk's output [B, H, T_c, d_v], differentiable in q, k, v.
at::Tensor lasp_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& decay,
                          int64_t chunk, comm::Group& sp, LaspVariant variant);

// Installs lasp_attention as the kernel of every linear-attention layer of `model` (arch linear,
// checked by check_sequence_parallel, sequence_parallel.h); `sp` must outlive the model's use.
void apply_lasp(TransformerLM& model, comm::Group& sp, LaspVariant variant);

}  // namespace tessera
