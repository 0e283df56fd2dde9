// Sequence parallelism for softmax attention (arch gpt): installs Ulysses (ulysses.h) or causal
// ring attention (ring_attention.h) as the attention kernel of every block of a model.
//
// The contract with the caller (the training step). On every rank t of the sp group (W ranks):
// - the model input is tokens [t C, (t+1) C) of each sequence, C = T / W equal on all ranks;
// - before forward, the caller sets model->set_position_offset(t * C) (t = sp.rank()), so that the
//   chunk gets its own learned positions;
// - every rank runs forward and backward of the same batches in the same order (the kernels are
//   collectives of `sp`, once per layer and direction; selective checkpointing repeats the
//   forward's communication in backward);
// - the loss on rank t is its chunk's; the chunks' logits are those of the whole sequence, so
//   gradients are reduced over the sp ranks as over data-parallel ones.
// check_sequence_parallel (sequence_parallel.h) refuses another architecture (model.arch),
// attention dropout (model.dropout > 0: the kernels apply none), and for Ulysses a head count that
// is not a multiple of W * tp (model.n_head, parallel.sp, parallel.tp).
#pragma once

#include <string>

#include "comm/group.h"
#include "model/transformer.h"

namespace tessera {

enum class SoftmaxSpMethod { ulysses, ring };

// "ulysses" | "ring"; throws naming parallel.sp_method otherwise.
SoftmaxSpMethod softmax_sp_method(const std::string& sp_method);

// Installs the method's kernel in every block's softmax attention; `sp` must outlive the model's
// use. With sp.size() == 1 the kernels are plain causal SDPA.
void apply_sequence_parallel_attention(TransformerLM& model, comm::Group& sp, const std::string& method);

}  // namespace tessera
