// A run's checkpoints, as one component: how the run's layout saves, resumes (at any layout),
// starts from another checkpoint's weights, and what a save that fails leaves behind.
//
// Three layers, each with one job, and this file the only one that puts them together:
//   checkpoint/                     the format: files, checksums, atomic commits, verification,
//                                   reassembly of shards and parts (checkpoint/checkpoint.h)
//   ParallelModel's state methods   the layout's state in a form independent of the layout
//                                   (whole tensors, or this rank's slices and parts of them, under
//                                   the model's own names; parallel/parallelize.h), each tensor's
//                                   kind declared by its owner (core/state_kind.h)
//   RunCheckpoints (here)           the run's position (step, data position, tokens, time, each
//                                   rank's random streams, the gradient compressors', the
//                                   collaboration's state), which write path the layout takes,
//                                   and the policy: when old ones are pruned, how a failed save
//                                   is reported
//
// Writing (save): one process writes the plain checkpoint (a model.safetensors that Hugging Face's
// transformers loads as it is, and one optimizer.safetensors); several ranks each write their
// shards into one partial directory that rank 0 commits after a barrier (with checkpoint.gather
// the ranks > 0 write on their own disks and send the files to rank 0: train/checkpoint_transfer.h).
// Both go through checkpoint/'s atomic commit. A save that fails removes its partial directory
// (rank 0) and fails naming the checkpoint the run can still resume from.
//
// Reading: resume() loads every rank's parts of the model and of the optimizer state (each rank
// only the ranges it keeps), restores the compressors (merged when the rank count changed), the
// random streams (re-seeded, with a note, when the checkpoint holds none for this rank) and the
// data position (checked against the data now present); init_from() loads the model's weights
// alone (step 0, a fresh optimizer).
//
// Random stream states are saved among the training state as "rng.rank<r>.<stream>.<device type>",
// whole; random_state_prefix(r) is "rng.rank<r>.". They are this component's own: bytes to the
// checkpoint's checks.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "comm/mesh.h"
#include "config/config.h"
#include "data/sampler.h"
#include "data/training_data.h"
#include "train/collaboration.h"
#include "train/train_step.h"

namespace tessera {

std::string random_state_prefix(int64_t rank);
bool is_random_state(const std::string& name);

// Where the run stands when it saves, beside the layout's state (the data position is the sampler's).
struct RunPosition {
  int64_t step = 0;
  int64_t tokens_seen = 0;
  double elapsed_s = 0;  // trained so far, this process and those before it
};

// What resume() hands back to the training loop.
struct Resumed {
  RunPosition position;
  std::vector<std::string> notes;  // for the run's log: continuations that are not exact
  // A collaborating run's own state (train/collaboration.h), for Collaboration::attach.
  nlohmann::json collaboration_meta;
  std::map<std::string, at::Tensor> collaboration_tensors;
};

class RunCheckpoints {
 public:
  // `mesh` may be null (one process), `collaboration` too. Every reference outlives this object.
  RunCheckpoints(const Config& config, std::string run_dir, TrainStep& step, comm::Mesh* mesh,
                 Collaboration* collaboration, const TrainingData& data, BatchSampler& sampler);

  // The model's weights alone from `path` (a step, checkpoints or run directory): every rank reads
  // the tensors it keeps. Returns a note for the run's log.
  std::string init_from(const std::string& path);
  // The whole training state from `path`, at this layout; seeks the sampler to the saved position.
  // Collective when several ranks fetch a gathered checkpoint (checkpoint.gather).
  Resumed resume(const std::string& path);
  // This step's checkpoint; every rank takes part. Returns the committed directory (on rank 0; the
  // others return "") and prunes to checkpoint.keep.
  std::string save(const RunPosition& position);
  // The last checkpoint this run wrote, "" before the first.
  const std::string& last() const { return last_; }

 private:
  std::string write(const RunPosition& position);
  nlohmann::json meta(const RunPosition& position) const;
  std::string checkpoints_dir() const { return run_dir_ + "/checkpoints"; }
  bool distributed() const { return mesh_ && mesh_->world_size() > 1; }
  bool compressing() const { return distributed() && config_.parallel.grad_compression != "none"; }

  const Config& config_;
  std::string run_dir_;
  TrainStep& step_;
  comm::Mesh* mesh_;
  Collaboration* collaboration_;
  const TrainingData& data_;
  BatchSampler& sampler_;
  int64_t rank_ = 0;
  std::string last_;
  // An imported model's Hugging Face files (model/hf_config.h: generation_config.json, ...) as the
  // checkpoint this run started from (init_from or resume) held them, read at the start (that
  // checkpoint may be pruned later): every checkpoint of the run writes them, so `tessera export
  // --hf` gives them back after fine-tuning.
  std::vector<std::pair<std::string, std::string>> carried_files_;
};

}  // namespace tessera
