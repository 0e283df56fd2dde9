// One optimizer step of a parallelized model, and the state it owns: the run's layout (plan/layout.h,
// made once here from the resolved config, the mesh and what the layout needs measured), the
// model (built as the layout's stage of this rank, then parallelize()d: parallel/parallelize.h),
// its step runner and optimizer owner, and the mixed-precision policy. The trainer and `tessera
// bench` both drive this class, so the benchmark times exactly what training runs.
//
// A step: this rank's part of each micro-batch (its sequence chunk) through the step runner
// (protocols/step_runner.h: plain, pipeline or swapped; the step does not know which), which runs
// forward, backward and the owner's update (gradients reduced over the replicas, unscaled,
// clipped to the global norm, applied at `lr`, zeroed). Losses reported are means over the
// replicas that ran different data; training_state() and evaluate() are collectives (every rank
// calls them). Under memory.swap the model is built in host memory and only the swap plan brings
// parts of it over.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "comm/mesh.h"
#include "data/sampler.h"
#include "model/moe.h"
#include "model/transformer.h"
#include "parallel/parallelize.h"
#include "precision/fp16.h"
#include "plan/layout.h"
#include "config/config.h"

namespace tessera {

struct StepResult {
  double ce_loss = 0;   // mean over micro-batches
  double aux_loss = 0;  // MoE auxiliary terms, mean over micro-batches
  double grad_norm = 0;
  bool skipped = false;  // fp16 overflow: no update was made
  bool applied = true;   // false: the outer reduction held the gradients out (no update)
  std::vector<MoELayerStatistics> moe;  // per MoE layer of the model, over every rank (model/moe.h)
};

class TrainStep {
 public:
  // Sets the intra-op threads (train.threads), measures what the layout needs (the blocks under
  // parallel.pp_cut = profile, a collective of the world; the swap costs under memory.swap), makes
  // the layout, seeds torch with train.seed, builds this rank's stage of the model on the meta
  // device and parallelizes it over `mesh` (null: one process), which materialises this rank's
  // parts on train.device (refused by name when CUDA is asked for but absent).
  explicit TrainStep(const Config& config, comm::Mesh* mesh = nullptr);
  ~TrainStep();

  // The config the step runs (as given: never changed) and its layout.
  const Config& config() const { return config_; }
  const Layout& layout() const { return parallel_->layout(); }
  // The step runner: its last step's timeline (write_timeline) and bench fields.
  StepRunner& runner() { return parallel_->runner(); }

  // `observe`, when given, receives the step's final gradients (reduced over the replicas,
  // unscaled, before clipping and the update) whole, under the model's parameter names: a
  // collective (every rank passes one), for the equivalence harness and debugging.
  using GradientObserver = std::function<void(const NamedTensors& gradients)>;
  StepResult run(const std::vector<Batch>& micro_batches, double lr, const GradientObserver& observe = {});
  // An outer reduction of each step's final gradients beyond the mesh (the ATOM swarm's batch
  // mode, atom/swarm.h): given them (live: GradientHolder::final_gradients, protocols/optimizer_owner.h)
  // and the step's samples (the sequences of its micro-batches), it returns whether to update now,
  // with the gradients it left in them; false holds the step's gradients out (no update). It runs before the observer, which
  // sees what is applied. Refused, naming why, unless this process's owner holds its gradients
  // whole (one process: resident or swapped).
  using OuterReduction = std::function<bool(const std::vector<at::Tensor>& gradients, int64_t samples)>;
  void set_outer_reduction(OuterReduction reduce);
  // The owner as a GradientHolder when this process holds a whole replica (else null).
  GradientHolder* gradient_holder() { return parallel_->gradient_holder(); }
  // Mean cross-entropy over `batches`, without gradients, in eval mode (each data-parallel rank
  // evaluates its share of every batch's rows).
  double evaluate(const std::vector<Batch>& batches);

  TransformerLM& model() { return parallel_->model(); }
  // The model's parameters in Hugging Face names (model/hf_names.h), whole whatever the layout.
  NamedTensors model_state() { return parallel_->model_state(); }
  // This rank's share of the model for a checkpoint of one file per rank (parallel/parallelize.h).
  std::vector<TensorSlice> model_state_shard() { return parallel_->model_state_shard(); }
  // Loads HF-named parameters (a checkpoint's model) into the model, on every rank.
  void load_model_state(const ModelReader& reader) { parallel_->load_model_state(reader); }
  c10::Device device() const { return device_; }
  // Seeds this rank's random streams for `step` (parallel/parallelize.h).
  void seed_random_streams(int64_t step) { parallel_->seed_random_streams(step); }
  const DynamicLossScaler* loss_scaler() const { return parallel_->owner().loss_scaler(); }
  c10::ScalarType compute_dtype() const;

  // Optimizer, fp32 master weights and loss scaler, named "optim.", "master.", "scaler.", whole.
  NamedTensors training_state() { return parallel_->training_state(); }
  // Takes the tensors as load_checkpoint(..., training_state_ranges()) returns them.
  void load_training_state(const std::map<std::string, at::Tensor>& tensors, const std::string& source) {
    parallel_->load_training_state(tensors, source);
  }
  OptimizerRanges training_state_ranges() const { return parallel_->training_state_ranges(); }
  StateKind state_kind(const std::string& name) const { return parallel_->state_kind(name); }
  std::vector<TensorSlice> training_state_slices() { return parallel_->training_state_slices(); }
  // The gradient compressor's state of this rank (parallel/data/data_parallel.h); empty without
  // data parallelism or compression. Loading refuses a non-empty state where there is none.
  NamedTensors compression_state() const { return parallel_->owner().compression_state(); }
  void load_compression_state(const std::map<std::string, at::Tensor>& tensors, const std::string& source) {
    parallel_->owner().load_compression_state(tensors, source);
  }

 private:
  // This rank's columns of each batch (its sequence chunk under sequence parallelism).
  std::vector<Batch> local_batches(const std::vector<Batch>& batches);

  Config config_;
  c10::Device device_;
  std::optional<at::ScalarType> autocast_;
  std::unique_ptr<ParallelModel> parallel_;
  OuterReduction outer_;
};

}  // namespace tessera
