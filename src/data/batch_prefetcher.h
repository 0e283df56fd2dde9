// The next step's micro-batches drawn while this step runs (docs/gpu.md: the host between steps).
//
// A step's batches are a pure function of the sampler's position (sampler.h), so the prefetcher
// draws step k + 1 from its own copy of the sampler on a background thread, as soon as step k's
// batches are handed out, and makes every input and target contiguous, and with `pin` page-locked
// (pinned host memory, for an asynchronous copy to a CUDA device that waits on nothing). The step
// then finds its batches ready instead of gathering, copying and pinning them with the device idle.
//
// Invariants:
// - next() returns exactly what sampler.next() would (equal tensors, contiguous), and advances
//   `sampler` by one step: its position() stays the run's (checkpoints record it), and a seek on it
//   between calls (a resume) is honoured: a prefetched step of another position is dropped.
// - At most one step is drawn ahead; its thread only reads the token files (memory-mapped) and
//   allocates its own tensors, so it shares no mutable state with the step.
#pragma once

#include <future>
#include <vector>

#include "data/sampler.h"

namespace tessera {

// `batch` contiguous, and with `pin` in page-locked host memory: what a step is handed, by the
// prefetcher in training and by `tessera bench`.
Batch prepared_for_copy(const Batch& batch, bool pin);

class BatchPrefetcher {
 public:
  BatchPrefetcher(BatchSampler& sampler, bool pin);
  ~BatchPrefetcher();
  BatchPrefetcher(const BatchPrefetcher&) = delete;
  BatchPrefetcher& operator=(const BatchPrefetcher&) = delete;

  std::vector<Batch> next();

 private:
  BatchSampler& sampler_;
  BatchSampler ahead_sampler_;
  bool pin_;
  int64_t ahead_position_ = -1;  // the step `ahead_` draws (-1: none)
  std::future<std::vector<Batch>> ahead_;
};

}  // namespace tessera
