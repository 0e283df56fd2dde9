// Sequence parallelism's layout check and kernel choice (sequence_parallel.h).
#include "parallel/sequence/sequence_parallel.h"

#include "core/error.h"
#include "parallel/sequence/lasp.h"
#include "parallel/sequence/softmax_attention_sp.h"

namespace tessera {

void check_sequence_parallel(const ModelOptions& m, const ParallelOptions& p, const ParallelDims& d, int64_t seq_len) {
  if (d.sp() == 1) return;
  require(seq_len % d.sp() == 0, "train.seq_len = ", seq_len, " is not divisible by parallel.sp = ", d.sp(),
          " (each rank takes an equal contiguous chunk)");
  const std::string& method = p.sp_method;
  if (m.arch == "linear") {
    require(method == "auto" || method == "lasp" || method == "lasp2", "parallel.sp_method = \"", method,
            "\" with model.arch = linear: ulysses and ring attention split softmax attention; use lasp or lasp2");
    return;
  }
  require(method == "auto" || method == "ulysses" || method == "ring", "parallel.sp_method = \"", method,
          "\" with model.arch = ", m.arch, ": LASP needs linear attention; use ring or ulysses");
  require(m.dropout == 0, "model.dropout = ", m.dropout, " with parallel.sp = ", d.sp(),
          ": sequence-parallel softmax attention applies no attention dropout; set model.dropout = 0");
  require(method != "ulysses" || m.n_head % (d.sp() * d.tp()) == 0, "model.n_head = ", m.n_head,
          " is not a multiple of parallel.sp * parallel.tp = ", d.sp() * d.tp(),
          " (Ulysses gives each rank whole heads of its tensor-parallel share); use ring");
}

void apply_sequence_parallel(TransformerLM& model, comm::Group& sp, const std::string& sp_method) {
  if (model->options().arch == "linear")
    apply_lasp(model, sp, lasp_variant(sp_method == "auto" ? "lasp" : sp_method));
  else
    apply_sequence_parallel_attention(model, sp, sp_method == "auto" ? "ring" : sp_method);
}

}  // namespace tessera
