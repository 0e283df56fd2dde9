// Sequence parallelism as one component of parallelize() (parallel/parallelize.h): its layout
// check and the choice of kernel by parallel.sp_method and model.arch.
//
//   model.arch   sp_method            kernel installed in every block (this stage's)
//   linear       auto, lasp, lasp2    LASP ring / LASP-2 all-gather (lasp.h)
//   gpt          auto, ring, ulysses  causal ring attention / Ulysses (softmax_attention_sp.h)
//
// The caller's contract (each rank runs its contiguous chunk of every sequence, positions from
// set_position_offset, gradients reduced over dp x sp) is stated in lasp.h and
// softmax_attention_sp.h.
#pragma once

#include <cstdint>
#include <string>

#include "comm/group.h"
#include "core/parallel_dims.h"
#include "core/parallel_options.h"
#include "model/transformer.h"

namespace tessera {

// Refuses, naming the keys: train.seq_len not divisible by sp; an sp_method that does not fit
// model.arch; attention dropout with softmax sp; Ulysses with model.n_head not a multiple of
// sp * tp (each rank's tensor-parallel heads are split again over sp). Nothing to check at sp = 1.
void check_sequence_parallel(const ModelOptions& model, const ParallelOptions& parallel, const ParallelDims& dims,
                             int64_t seq_len);

// Installs the kernel of parallel.sp_method for model.arch (the table above) over `sp`.
void apply_sequence_parallel(TransformerLM& model, comm::Group& sp, const std::string& sp_method);

}  // namespace tessera
