// Trainer::State: what the training loop holds (trainer.h), shared by trainer.cpp (construction,
// the loop) and trainer_checkpoint.cpp (writing the run's checkpoints). Internal to train/.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "config/config.h"
#include "data/sampler.h"
#include "data/training_data.h"
#include "train/progress.h"
#include "train/train_step.h"
#include "train/trainer.h"

namespace tessera {

struct Trainer::State {
  Config config;
  std::string run_dir;
  std::string resume;
  c10::Device device{at::kCPU};

  std::optional<TrainingData> data;
  int64_t accumulation = 1;  // micro-batches per step on this rank
  std::unique_ptr<BatchSampler> sampler;
  std::vector<Batch> eval_batches;
  double unigram = 0;

  std::unique_ptr<TrainStep> trainer;
  comm::Mesh* mesh = nullptr;
  Collaboration* collaboration = nullptr;
  int64_t rank = 0, dp = 1, dp_rank = 0;

  int64_t step = 0;
  int64_t tokens_seen = 0;
  double elapsed_before = 0;  // seconds trained before this process (resume)
  std::vector<std::string> start_notes;  // printed once the progress line exists
  // An imported model's Hugging Face files (model/hf_config.h: generation_config.json, ...) as the
  // checkpoint this run started from (init_from or resume) held them, read at the start (that
  // checkpoint may be pruned later): every checkpoint of the run writes them, so `tessera export
  // --hf` gives them back after fine-tuning.
  std::vector<std::pair<std::string, std::string>> carried_files;

  // Set by run().
  bool lead = true;          // rank 0: writes the run's files and commits checkpoints
  bool distributed = false;  // several ranks
  std::chrono::steady_clock::time_point run_start;
  std::string last_checkpoint;  // the last checkpoint this run wrote, "" before the first

  std::string checkpoints_dir() const { return run_dir + "/checkpoints"; }
  bool compressing() const { return distributed && config.parallel.grad_compression != "none"; }
  double elapsed_s() const;  // trained so far, this process and those before it

  // This step's checkpoint (trainer_checkpoint.cpp): every rank takes part; one process writes a
  // plain checkpoint, several write their shards into one partial directory that rank 0 commits
  // after a barrier (checkpoint/checkpoint.h); old ones are pruned to checkpoint.keep. save()
  // writes it, and when that fails removes the partial directory and fails naming the checkpoint
  // the run can still resume from.
  void save(Progress& progress);
  // Every rank stops at the same step when any rank has a reason (stop_request.h): it saves
  // (unless this step was just saved), says how to continue and returns true.
  bool stop_requested(bool saved, Progress& progress, TrainSummary& summary);

 private:
  void write_checkpoint(Progress& progress);
};

// Each rank's random stream states (core/random_streams.h) are saved among the training state as
// "rng.rank<r>.<stream>.<device type>", whole (trainer_checkpoint.cpp); random_state_prefix(r) is
// "rng.rank<r>.". They are the trainer's own: bytes to the checkpoint's checks (core/state_kind.h).
std::string random_state_prefix(int64_t rank);
bool is_random_state(const std::string& name);

}  // namespace tessera
