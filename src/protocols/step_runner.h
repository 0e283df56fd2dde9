// StepRunner: what runs one training step of a parallelized model, whatever its layout. parallelize()
// (parallel/parallelize.h) returns one, and the training step (train/train_step.h) drives it
// without asking which it is:
//   PlainStep     (parallel/plain_step.h)     the micro-batches one after the other on a resident
//                 model (one process, dp, tp, sp and their combinations)
//   PipelineStep  (parallel/pipeline_step.h)  the layout's pipeline schedule over this rank's stages
//   SwapStep      (parallel/swap_step.h)      the layout's swap plan over a model in host memory
//
// run(): forward and backward of each micro-batch (this rank's part of it: its sequence chunk is
// cut by the caller), then the update at `lr` with the gradient clipping of optim.grad_clip;
// `gradients_ready`, when given, runs once the step's final gradients exist (reduced over the
// replicas, unscaled, before clipping and the update) on every rank: the equivalence harness reads
// them there (a collective), the ATOM swarm averages them there. It returns whether to update:
// false holds the gradients out (the owner drops them, no update is made, UpdateResult::applied
// is false). The losses are sums over this rank's micro-batches; for the mean over the replicas
// the caller averages them.
//
// evaluate(): the mean cross-entropy over `batches` (this rank's rows and columns), forward only, in
// eval mode; known on every rank of the model-parallel groups.
//
// write_timeline(): a runner that records its actions writes the last step's timeline into `dir`
// (pictures named after `step`) and returns a line saying what it wrote; one that records nothing
// returns nullopt. A collective where the runner's ranks gather their timelines.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/sampler.h"
#include "protocols/optimizer_owner.h"

namespace tessera {

struct StepLosses {
  // float64 0-dim tensors, on the host or on the device (unread there: the training step reads them
  // and the norm in one copy at the step's end, so that a GPU step never waits on its device)
  at::Tensor ce_sum;   // summed over this rank's micro-batches
  at::Tensor aux_sum;  // MoE auxiliary terms, likewise
  UpdateResult update;
};

using GradientsReady = std::function<bool()>;

class StepRunner {
 public:
  virtual ~StepRunner() = default;
  virtual StepLosses run(const std::vector<Batch>& micro_batches, double lr, const GradientsReady& gradients_ready) = 0;
  virtual double evaluate(const std::vector<Batch>& batches) = 0;
  virtual std::optional<std::string> write_timeline(const std::string& dir, int64_t step) { return std::nullopt; }
  // A line for the user about the step just run, once (the pipeline's check of the step its
  // start-up profile predicted); nothing by default.
  virtual std::optional<std::string> take_note() { return std::nullopt; }
  // `tessera bench`: the steps run from here on are timed (a runner that measures its steps keeps
  // what they measured for add_bench_fields).
  virtual void start_timing() {}
  // What the timed steps (or the last step) measured beyond their time, for `tessera bench`'s JSON
  // (the swap plan's predicted and exposed load, the pipeline's bubble, ...); nothing by default.
  virtual void add_bench_fields(nlohmann::json& out) {}
};

}  // namespace tessera
