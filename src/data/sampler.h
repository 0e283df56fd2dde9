// Batches of token windows: random windows for training, a fixed set for evaluation.
//
// Training (BatchSampler): window i of batch k starts at
//   offset(k, i) = splitmix64(splitmix64(seed) + k * B + i) mod (N - T)
// for a file of N tokens, so every batch is a pure function of (seed, k): seek(k) then next()
// equals the k-th batch of a fresh sampler, and resuming from a checkpoint needs only position().
// Evaluation (evaluation_batches): evenly spaced windows from the start to the end of the file,
// the same on every call.
//
// Shapes: inputs and targets [B, T] int64 on the CPU; targets[b][t] = inputs[b][t + 1] within the
// file (each window reads T + 1 tokens).
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "data/token_file.h"

namespace tessera {

struct Batch {
  at::Tensor inputs, targets;  // [B, T] int64
};

class BatchSampler {
 public:
  // Throws naming the file when it holds fewer than seq_len + 1 tokens. With `rows` > 0, next()
  // returns only rows [first_row, first_row + rows) of each batch of `batch` windows: a data-parallel
  // rank's slice of the global batch, so N ranks together read exactly what one process would.
  BatchSampler(const TokenFile& file, int64_t batch, int64_t seq_len, uint64_t seed, int64_t first_row = 0,
               int64_t rows = 0);

  Batch next();
  int64_t position() const { return position_; }  // batches drawn so far
  void seek(int64_t position);
  int64_t offset(int64_t k, int64_t i) const;  // start of window i of batch k

 private:
  TokenFile file_;
  int64_t batch_, seq_len_;
  uint64_t seed_;
  int64_t first_row_, rows_;
  int64_t position_ = 0;
};

// n_batches batches of evenly spaced windows over the whole file; fewer when the file holds fewer
// than n_batches * batch disjoint windows, but always at least one (windows then overlap).
std::vector<Batch> evaluation_batches(const TokenFile& file, int64_t n_batches, int64_t batch, int64_t seq_len);

}  // namespace tessera
