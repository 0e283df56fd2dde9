// Top-k sparsification with error feedback (Stich et al. 2018 "Sparsified SGD with memory";
// Lin et al. 2018 "Deep Gradient Compression" without momentum correction).
//
// Per bucket b, in float32 (N = group size):
//   acc [numel] = the bucket's gradients flattened in order + the residual
//   k = ceil(parallel.topk_ratio * numel) (computed in double, at least 1)
//   this rank sends the k entries of largest |acc| as (int32 index, float32 value) pairs; one
//   all_gather brings every rank's k pairs (the indices travel as the bit patterns of float32
//   elements of the same message: all_gather copies bytes, it never computes on them)
//   mean [numel] = (sum over ranks r, in rank order, of rank r's values scattered to its
//   indices) / N, which replaces the gradients; the same on every rank
//   residual = acc with the k sent entries set to zero, i.e. acc - what this rank sent.
//
// Bytes sent per rank per step (ring all-gather): (N-1) * 8k, against 2 (N-1)/N * 4 numel for a
// float32 all-reduce: a ratio of N k / numel, so top-k saves bytes only while N * ratio < 1.
// With ratio 1 every entry is sent and the result is the exact mean.
//
// State per bucket: "topk.bucket<b>.residual" float32 [bucket numel], from its first step on.
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
  explicit TopK(double ratio);

  void all_reduce_mean(std::vector<at::Tensor>& grads, int64_t bucket, comm::Group& group) override;
  NamedParams state() const override;
  void load_state(const std::map<std::string, at::Tensor>& state, const std::string& source) override;

  // k for a bucket of `numel` elements.
  int64_t count(int64_t numel) const;

 private:
  struct Bucket {
    at::Tensor residual;      // float32 [numel] on the gradients' device
    std::string loaded_from;  // the checkpoint whose residual is still unchecked against the bucket
  };

  double ratio_;
  std::map<int64_t, Bucket> buckets_;
};

}  // namespace tessera
