// Collaboration: what the training loop (train/trainer.h) asks of a run that trains together with
// other processes beyond its own mesh: the ATOM swarm's peer (atom/swarm.h). `tessera train` has
// none; `tessera peer` gives one, and the loop stays the same loop.
//
// The loop's step counts the updates of this process's optimizer: under the swarm's batch mode
// the swarm's steps (a local step whose gradients the swarm holds for a later round is not one),
// under DiLoCo the local inner steps.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "train/train_step.h"

namespace tessera {

class Collaboration {
 public:
  virtual ~Collaboration() = default;
  // The seed of this process's data stream (its batches must differ from the others').
  virtual uint64_t data_seed(uint64_t configured) const = 0;
  // Once the step exists and any checkpoint was loaded (`meta`: its meta.json's "collaboration"
  // entry, or null; `tensors`: its optimizer file's tensors, checkpoint_tensors() among them):
  // installs what the collaboration needs (an outer reduction), joins the others and returns the
  // step to continue from (`step_number` itself, or the step of a state downloaded from the
  // others, which is then in the step's model and optimizer).
  virtual int64_t attach(TrainStep& step, int64_t step_number, const nlohmann::json& meta,
                         const std::map<std::string, at::Tensor>& tensors) = 0;
  // After each local step whose update was applied (DiLoCo's outer step runs here when due).
  virtual void after_update(TrainStep& step, int64_t step_number) = 0;
  // After every local step, applied or held: the samples it processed and its loss. Returns the
  // step to continue from when the collaboration replaced the step's state (a peer that fell
  // behind downloads the others'), else nullopt.
  virtual std::optional<int64_t> after_local_step(TrainStep& step, int64_t samples, double loss, double seconds) = 0;
  // Lines for the log since the last call (rounds, peers joining and leaving, refusals).
  virtual std::vector<std::string> take_messages() = 0;
  // Fields of the metrics line and of the checkpoint's meta.json ("collaboration").
  virtual nlohmann::json metrics() const = 0;
  virtual nlohmann::json checkpoint_state() const = 0;
  // Tensors a checkpoint keeps beside the optimizer's ("swarm.*": the accumulated gradient).
  virtual NamedTensors checkpoint_tensors() const = 0;
  // Before the process ends: leaves the others (no more records, no more rounds).
  virtual void leave() = 0;
};

}  // namespace tessera
