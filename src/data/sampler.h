// Batches of token windows: random windows for training, a fixed set for evaluation.
//
// Training (BatchSampler). A step draws the run's global batch of G = B x dp x A windows (B the
// micro-batch, dp the data-parallel ranks, A the micro-batches accumulated per step); window g of
// step k starts at
//   offset(k, g) = splitmix64(splitmix64(seed) + k * G + g) mod (N - T)
// for a stream of N tokens, and micro-batch m of data-parallel rank r reads windows
//   g = (m * dp + r) * B + [0, B).
// So:
// - every step is a pure function of (seed, G, k): seek(k) then next() equals the k-th step of a
//   fresh sampler, and resuming from a checkpoint needs only position() (steps drawn);
// - the windows of a step, and how they group into micro-batches of B, are the same for every
//   decomposition of G into ranks and accumulation (2 ranks x 16 = 1 rank x 16 x 2 micro-batches),
//   so such runs compute the same gradient up to summation order, and a checkpoint resumes under
//   another decomposition of the same global batch.
// Evaluation (evaluation_batches): evenly spaced windows from the start to the end of the
// stream, the same on every call.
//
// Shapes: inputs and targets [B, T] int64 on the CPU; targets[b][t] = inputs[b][t + 1] within the
// stream (each window reads T + 1 tokens, possibly across a shard boundary).
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "data/token_stream.h"

namespace tessera {

struct Batch {
  at::Tensor inputs, targets;  // [B, T] int64
};

// How a step's global batch is split: B windows per micro-batch, `accumulation` micro-batches per
// step on each of `dp` ranks; this process is data-parallel rank `dp_rank`.
struct BatchLayout {
  int64_t micro_batch = 1;
  int64_t dp = 1;
  int64_t dp_rank = 0;
  int64_t accumulation = 1;
  int64_t global_batch() const { return micro_batch * dp * accumulation; }
};

class BatchSampler {
 public:
  // Throws naming the stream when it holds fewer than seq_len + 1 tokens.
  BatchSampler(const TokenStream& data, const BatchLayout& layout, int64_t seq_len, uint64_t seed);

  std::vector<Batch> next();  // this rank's `accumulation` micro-batches of the next step
  int64_t position() const { return position_; }  // steps drawn so far
  int64_t global_batch() const { return layout_.global_batch(); }
  void seek(int64_t position);
  int64_t offset(int64_t step, int64_t g) const;  // start of window g of a step's global batch

 private:
  TokenStream data_;
  BatchLayout layout_;
  int64_t seq_len_;
  uint64_t seed_;
  int64_t position_ = 0;
};

// n_batches batches of evenly spaced windows over the whole stream; fewer when it holds fewer
// than n_batches * batch disjoint windows, but always at least one (windows then overlap).
std::vector<Batch> evaluation_batches(const TokenStream& data, int64_t n_batches, int64_t batch, int64_t seq_len);

}  // namespace tessera
