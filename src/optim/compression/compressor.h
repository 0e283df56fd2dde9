// GradientCompressor: how data parallelism averages one bucket of gradients over the dp group
// when parallel.grad_compression is not "none". make_compressor() picks one of
//   bf16, fp16  16-bit casts around a plain all-reduce (below, in compressor.cpp);
//   powersgd    low-rank approximation with error feedback and warm start (powersgd.h);
//   topk        the largest entries of each bucket, with error feedback (topk.h).
//
// Contract with the caller (DataParallel):
// - all_reduce_mean() is called once per bucket per optimizer step, one call at a time, with the
//   same buckets (same tensors' shapes, same order) in the same order on every rank of `group`.
//   It is a collective: every rank calls it, and it returns when the bucket is averaged.
// - DataParallel calls it on `group`'s communication thread (comm::Group::run_async) while
//   backward is still running, so it must use no thread-local state of the training thread;
//   state() and load_state() are called on the training thread only when no bucket is in flight.
// - `bucket` names the bucket across steps; per-bucket state (residuals, PowerSGD's Q, step
//   counts) is keyed by it. A bucket keeps its layout for the whole run.
// - Gradients may be any floating dtype and shape; PowerSGD and top-k compute in float32 and
//   write each result back in the gradient's own dtype.
// - On return every rank holds the same values (each rank reduces the same received data in
//   the same order), so replicas do not drift apart.
//
// Error feedback (powersgd, topk): each rank adds its residual to its gradient before
// compressing and keeps as the new residual what the step did not deliver of that sum, so that
// over any number of steps (to float32 rounding)
//   sum of applied updates + mean over ranks of the residuals = sum of the true mean gradients.
//
// Checkpointing: state() lists "<compressor>.bucket<b>.<slot>" tensors (see each compressor), the
// live ones (copy them before the next step if a snapshot is needed). Residuals differ between
// ranks, so every rank saves and loads its own. load_state() copies and replaces the whole state,
// and load_state(state()) changes nothing the next steps compute. Names, dtypes and ranks of the
// tensors are checked when loading; sizes are checked against the bucket's layout at that
// bucket's next call, since buckets are only known once they are reduced. Every refusal names
// `source` and the tensor.
//
// Resuming at another number of ranks: merge_rank_states() turns the saved states of M ranks into
// the one state every rank of the new group loads. Tensors equal on every rank (PowerSGD's Q and
// step counts, which the collectives keep identical) are kept; the others (residuals) are
// averaged. Each new rank then holds the old mean residual, so the error-feedback invariant above
// carries over the change exactly.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "comm/group.h"
#include "core/parallel_options.h"
#include "optim/optimizer.h"

namespace tessera {

class GradientCompressor {
 public:
  virtual ~GradientCompressor();
  // Replaces each tensor in `grads` (one bucket: the full gradients of some parameters, any
  // shapes) by an approximation of its mean over `group`.
  virtual void all_reduce_mean(std::vector<at::Tensor>& grads, int64_t bucket, comm::Group& group) = 0;
  // State that must survive a checkpoint, named. The default (stateless compressors) is empty.
  virtual NamedParams state() const;
  // The default refuses any entry, naming `source`.
  virtual void load_state(const std::map<std::string, at::Tensor>& state, const std::string& source);
};

// nullptr for "none"; otherwise the compressor named by options.grad_compression, configured
// from parallel.powersgd_rank, parallel.powersgd_start_step, parallel.topk_ratio,
// parallel.topk_start_step and parallel.topk_warmup_steps. Throws
// tessera::Error naming parallel.grad_compression for an unknown name.
std::unique_ptr<GradientCompressor> make_compressor(const ParallelOptions& options);
// The values parallel.grad_compression takes: "none" and every compressor's name.
const std::vector<std::string>& compressor_names();

namespace compression {

// Splits "<prefix>.bucket<b>.<slot>" into (b, slot); throws naming `source` and `name` when the
// name does not have that form or the slot is not one of `slots`.
std::pair<int64_t, std::string> parse_state_name(const std::string& name, const std::string& prefix,
                                                 const std::vector<std::string>& slots, const std::string& source);
std::string state_name(const std::string& prefix, int64_t bucket, const std::string& slot);
// What a compressor's state entry holds (core/state_kind.h), for any compressor's names: a bucket's
// "step" is a counter, its other slots (residuals, PowerSGD's q) real.
StateKind state_kind(const std::string& name);

// The state for any number of ranks from `states`, one per saving rank (see the header comment).
// Throws naming `source` when the ranks' names or shapes differ, or when a non-floating tensor
// differs between ranks.
std::map<std::string, at::Tensor> merge_rank_states(const std::vector<std::map<std::string, at::Tensor>>& states,
                                                    const std::string& source);

// A loaded state tensor named `name`, as contiguous float32 on `device`; throws naming `source`
// when it does not hold `numel` elements (`what` says what those elements are).
at::Tensor checked_state(const at::Tensor& tensor, int64_t numel, const std::string& what, const std::string& name,
                         const std::string& source, c10::Device device);

}  // namespace compression
}  // namespace tessera
