// Trainer::State: what the training loop holds (trainer.h). Internal to trainer.cpp; its
// checkpoints are one component of their own (train/run_checkpoints.h).
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
#include "train/run_checkpoints.h"
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
  std::optional<RunCheckpoints> checkpoints;  // saves, resumes, starts from weights

  // Set by run().
  bool lead = true;          // rank 0: writes the run's files and commits checkpoints
  bool distributed = false;  // several ranks
  std::chrono::steady_clock::time_point run_start;

  double elapsed_s() const;  // trained so far, this process and those before it

  // This step's checkpoint (RunCheckpoints::save): every rank takes part; rank 0 says where it went.
  void save(Progress& progress);
  // Every rank stops at the same step when any rank has a reason (stop_request.h): it saves
  // (unless this step was just saved), says how to continue and returns true.
  bool stop_requested(bool saved, Progress& progress, TrainSummary& summary);
};

}  // namespace tessera
