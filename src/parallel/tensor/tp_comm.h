// The communication of Megatron tensor parallelism as autograd functions (Shoeybi et al., arXiv
// 1909.08053, and Korthikanti et al., arXiv 2205.05198 for the sequence-parallel pair;
// papers.md). Each function names the region it enters or leaves and states the collective it
// runs over the tensor-parallel group `tp` (N ranks) in forward and in backward:
//
//   function                     forward                          backward
//   copy_to_tp                   identity                         all-reduce (sum)
//   reduce_from_tp               all-reduce (sum)                 identity
//   scatter_to_tp                keep chunk rank() of the last    all-gather along the last dim
//                                dim (no communication)
//   gather_from_tp               all-gather along the last dim    keep chunk rank() (no communication)
//   scatter_to_sequence          keep chunk rank() of dim 1       all-gather along dim 1
//                                (no communication)
//   gather_from_sequence         all-gather along dim 1           reduce-scatter (sum) along dim 1
//   reduce_scatter_to_sequence   reduce-scatter (sum) along dim 1 all-gather along dim 1
//   sequence_gathered_linear     all-gather along dim 1, then the  all-gather of its saved input
//                                linear                           (weight gradient), reduce-
//                                                                 scatter (input gradient)
//
// "Chunk r along dim d" is x.chunk(N, d)[r]: the size along d must be a multiple of N (checked).
// Sequence functions work on [B, T, ...] activations, T being dim 1; rank r holds tokens
// [r T/N, (r+1) T/N) of every sequence. The collectives move contiguous copies in the layout
// [N, chunk] that comm::Group's flat all_gather / reduce_scatter expect and permute back.
//
// Invariants: every rank of `tp` calls the same functions on tensors of the same shape in the same
// order, forward and backward (they are collectives); `tp` outlives the graph that uses it. With
// N = 1 every function is the identity in both directions. Outputs never alias an input the
// collective wrote to, so a gradient buffer handed to backward is never modified.
// Bytes each rank sends (e = element size, comm/group.h): all-reduce 2(N-1)/N of the tensor,
// all-gather and reduce-scatter (N-1)/N of the full (gathered) tensor.
#pragma once

#include <ATen/core/Tensor.h>

#include "comm/group.h"

namespace tessera {

// Enters a tensor-parallel region whose ranks all need x (input of a column-parallel linear).
at::Tensor copy_to_tp(const at::Tensor& x, comm::Group& tp);
// Leaves it by summing the ranks' partial results (output of a row-parallel linear).
at::Tensor reduce_from_tp(const at::Tensor& x, comm::Group& tp);
// x [..., D] -> [..., D/N], this rank's chunk.
at::Tensor scatter_to_tp(const at::Tensor& x, comm::Group& tp);
// x [..., D/N] -> [..., D], the ranks' chunks in rank order.
at::Tensor gather_from_tp(const at::Tensor& x, comm::Group& tp);

// Megatron sequence parallelism: the LayerNorm / dropout / residual region holds [B, T/N, ...].
// x [B, T, ...] -> [B, T/N, ...], this rank's tokens.
at::Tensor scatter_to_sequence(const at::Tensor& x, comm::Group& tp);
// x [B, T/N, ...] -> [B, T, ...] (input of a column-parallel linear).
at::Tensor gather_from_sequence(const at::Tensor& x, comm::Group& tp);
// x [B, T, ...] partial sums -> [B, T/N, ...] summed over ranks (output of a row-parallel linear).
at::Tensor reduce_scatter_to_sequence(const at::Tensor& x, comm::Group& tp);

// A column-parallel linear entered from the sequence-parallel region, as Korthikanti et al. do it:
// linear(gather_from_sequence(x), weight, bias) for x [B, T/N, in], but keeping this rank's x for
// the backward rather than the gathered [B, T, in], which the backward gathers again where the
// weight's gradient needs it (not for the input's gradient alone: a zero-bubble I gathers
// nothing), started before the input gradient's product and waited for after it. Saves (N - 1)/N
// of the input's activation memory for one more all-gather in the backward. The products run in the dtype the forward's did (autocast's, else the input's); the
// weight and bias gradients come back in the parameters' dtype (on a GPU under bf16 the weight's
// GEMM accumulates into float32, as model/linear.h's function does). Several weights (and their
// biases, all or none) are one product of their join along the output dimension, as
// linear_joined's; the function keeps the parameters, not their join or its cast, so a pipeline
// rank holds no copy of them per held micro-batch.
at::Tensor sequence_gathered_linear(const at::Tensor& x, at::TensorList weights, at::TensorList biases,
                                    comm::Group& tp);

}  // namespace tessera
