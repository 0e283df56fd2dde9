// Top-k sparsification with error feedback (Stich et al. 2018 "Sparsified SGD with memory";
// Lin et al. 2018 "Deep Gradient Compression": its exponential sparsity warm-up, without momentum
// correction), after a dense warm-up as PowerSGD's reference code has one.
//
// Per bucket b, its steps counted per bucket from 0 (N = group size, S = parallel.topk_start_step,
// W = parallel.topk_warmup_steps, ratio = parallel.topk_ratio):
//   step < S: plain all-reduce mean of the gradients; nothing but the step count is kept.
//   otherwise, in float32:
//     acc [numel] = the bucket's gradients flattened in order + the residual
//     ratio_t = ratio ^ ((t + 1) / (W + 1)) for t = step - S < W (from nearly dense down to the
//     ratio, geometrically), ratio_t = ratio from then on
//     k = ceil(ratio_t * numel) (computed in double, at least 1)
//     if N k >= numel (top-k would send at least the all-reduce's bytes): all-reduce mean of acc,
//     which replaces the gradients; residual = 0
//     otherwise this rank sends the k entries of largest |acc| as (int32 index, float32 value)
//     pairs; one all_gather brings every rank's k pairs (the indices travel as the bit patterns of
//     float32 elements of the same message: all_gather copies bytes, it never computes on them)
//     mean [numel] = (sum over ranks r, in rank order, of rank r's values scattered to its
//     indices) / N, which replaces the gradients; the same on every rank
//     residual = acc with the k sent entries set to zero, i.e. acc - what this rank sent.
//
// Bytes sent per rank per top-k step (ring all-gather): (N-1) * 8k, against 2 (N-1)/N * 4 numel for
// a float32 all-reduce: a ratio of N k / numel, so top-k saves bytes only while N * ratio < 1 (the
// all-reduce is taken where it would not). With ratio 1 every step is the exact mean.
//
// Why the warm-ups (docs/gradient_compression.md has the measurements): under AdamW a coordinate
// that error feedback delivers once every T steps, as the sum of T steady gradients, moves roughly
// sqrt(T) normalised steps where a dense run moves T (Adam's second moment sees the burst squared),
// so sparse steps learn slowly; dense early steps take the model through its fast early phase at
// the full rate.
//
// State per bucket: "topk.bucket<b>.step" int64 [] (steps taken), and from its first step >= S on
// "topk.bucket<b>.residual" float32 [bucket numel].
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "optim/compression/compressor.h"

namespace tessera {

class TopK : public GradientCompressor {
 public:
  TopK(double ratio, int64_t start_step, int64_t warmup_steps);

  void all_reduce_mean(std::vector<at::Tensor>& grads, int64_t bucket, comm::Group& group) override;
  NamedParams state() const override;
  void load_state(const std::map<std::string, at::Tensor>& state, const std::string& source) override;

  // The fraction of a bucket's entries sent at its step `step` (1 before start_step).
  double ratio_at(int64_t step) const;
  // k for a bucket of `numel` elements at its step `step`.
  int64_t count(int64_t numel, int64_t step) const;

 private:
  struct Bucket {
    int64_t step = 0;
    at::Tensor residual;      // float32 [numel] on the gradients' device; undefined before start_step
    std::string loaded_from;  // the checkpoint whose residual is still unchecked against the bucket
  };

  double ratio_;
  int64_t start_step_;
  int64_t warmup_steps_;
  std::map<int64_t, Bucket> buckets_;
};

}  // namespace tessera
