// The single-process training loop: data, model, precision, optimizer, evaluation, metrics,
// progress and checkpoints wired together from one Config.
//
// One optimizer step = train.grad_accum micro-batches of [train.batch_size, train.seq_len] tokens.
// Step numbers count completed optimizer steps; checkpoint step_<N> holds the state after step N,
// and resuming from it continues with step N+1 exactly as the uninterrupted run would (same data
// position, optimizer state, loss scale and RNG state; bit-identical losses in fp32 on CPU).
//
// The run directory receives config.toml (the resolved config), metrics.jsonl (one JSON object per
// logged step with step, loss, lr, tokens_per_s, mfu, grad_norm, elapsed_s; evaluation lines carry
// val_loss), train.log, and checkpoints/.
#pragma once

#include <memory>
#include <string>

#include "train/config.h"

namespace tessera {

struct TrainSummary {
  int64_t steps = 0;            // completed optimizer steps
  double last_loss = 0;         // training loss of the last step
  double last_val_loss = 0;     // validation loss at the end
  double unigram_baseline = 0;  // entropy of the training tokens' unigram distribution (nats)
  std::string checkpoint;       // the final checkpoint directory
};

class Trainer {
 public:
  // `resume` is empty for a fresh run, else a checkpoint, checkpoints or run directory.
  Trainer(Config config, std::string run_dir, std::string resume);
  ~Trainer();
  TrainSummary run();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace tessera
