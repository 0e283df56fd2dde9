// The model's size from its options: the parameters it stores and the training FLOPs per token,
// counted on a model built on the meta device (no allocation). Apart from model_options.h because
// it builds the model: options are checked without it.
#pragma once

#include <cstdint>

#include "model/model_options.h"

namespace tessera {

// Parameter count of TransformerLM(opts): the sum of its parameters' numel, counted on a model
// built on the meta device (the modules themselves, no allocation; a tied output head is wte and
// not counted twice, an untied one's lm_head counts).
int64_t parameter_count(const ModelOptions& opts);

// Training FLOPs per token (forward + backward) at sequence length seq_len:
//   6 * N_active + attention term, where N_active is parameter_count without wpe (positions are a
//   lookup, not a matmul; wte counts where it is the tied head's matmul, lm_head where the head is
//   untied) and with only top_k of the experts in MoE layers (the parameters declared Split::expert,
//   scaled by top_k / experts). The attention term is PaLM appendix B's 12*L*C*T with the causal
//   half counted: 6*L*W*T for softmax attention, W = n_head * head width (C unless model.head_dim). For linear attention the quadratic part only spans
//   a chunk, c = min(T, linear_chunk): 6*L*C*c (intra-chunk, causal half) + 12*L*C*d (the inter-chunk
//   q*S product and the state update k^T v, d = head_dim).
double flops_per_token(const ModelOptions& opts, int64_t seq_len);

}  // namespace tessera
