// The training loop of one process (one rank of a mesh, or the only one): data, the parallelized
// model and its optimizer (TrainStep), evaluation, metrics, progress and checkpoints wired
// together from one Config.
//
// One optimizer step = train.grad_accum micro-batches of [train.batch_size, train.seq_len] tokens.
// Step numbers count completed optimizer steps; checkpoint step_<N> holds the state after step N,
// and resuming from it continues with step N+1 exactly as the uninterrupted run would (same data
// position, optimizer state, loss scale and RNG state; bit-identical losses in fp32 on CPU).
//
// The run directory receives config.toml (the resolved config), metrics.jsonl (one JSON object per
// logged step with step, loss, lr, tokens_per_s, mfu, grad_norm, peak_memory_gib, elapsed_s;
// evaluation lines carry val_loss), the same scalars as TensorBoard's events.out.tfevents.tessera
// (unless train.tensorboard = false), train.log, and checkpoints/. Each step's batches are drawn
// while the step before it runs (data/batch_prefetcher.h).
//
// On several ranks (a mesh; any layout parallelize() accepts): one optimizer step reads train.batch_size sequences per
// micro-batch on each data-parallel rank, rank r taking rows [r * B, (r + 1) * B) of the global
// micro-batch the sampler draws, so N ranks read exactly what one process with N * B would.
// Rank 0 prints progress and writes config.toml, metrics.jsonl, the event file and train.log; checkpoints hold the
// model and optimizer state under the model's own names, whole or as each rank's slices
// (optimizer-*-of-N), so a checkpoint resumes at any dp size and ZeRO stage; every rank writes
// logs/rank_<r>.log.
//
// With a collaboration (an ATOM peer): the data stream is the peer's own, a local step whose
// gradients the swarm holds back is not a step (the step is the swarm's), the metrics line and the
// checkpoint's meta.json carry the collaboration's fields, and the data position is recorded
// apart from the step.
#pragma once

#include <memory>
#include <string>

#include "comm/mesh.h"
#include "config/config.h"
#include "train/collaboration.h"

namespace tessera {

struct TrainSummary {
  int64_t steps = 0;            // completed optimizer steps
  double last_loss = 0;         // training loss of the last step
  double last_val_loss = 0;     // validation loss at the end
  double unigram_baseline = 0;  // entropy of the training tokens' unigram distribution (nats)
  std::string checkpoint;       // the final checkpoint directory
  std::string stopped;          // why the run stopped before train.steps ("" = it did not)
};

// Where a run starts: from scratch (both empty), from a checkpoint's whole training state
// (`resume`: continue its run exactly), or from a checkpoint's model weights alone (`init_from`:
// step 0, a fresh optimizer and data position; an imported or another run's model, whose [model]
// the config must already hold, see Config::adopt_model). Each is a step, checkpoints or run
// directory.
struct TrainStart {
  std::string resume;
  std::string init_from;
};

class Trainer {
 public:
  // `mesh` may be null (one process). `collaboration` (null for `tessera train`): the others this
  // process trains with beyond its mesh (train/collaboration.h: the ATOM swarm's peer).
  Trainer(Config config, std::string run_dir, TrainStart start, comm::Mesh* mesh = nullptr,
          Collaboration* collaboration = nullptr);
  ~Trainer();
  TrainSummary run();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace tessera
