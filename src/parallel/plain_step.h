// PlainStep: the step runner (protocols/step_runner.h) of a model resident on this rank's device
// whose micro-batches run one after the other: one process, and data, tensor and sequence
// parallelism in any combination (their communication is inside the model and its owner).
//
// run(): for micro-batch m of M, forward under autocast (bf16), backward of loss / M times the
// owner's loss scale (fp16), the owner told before each backward (before_backward(m == M - 1): a
// DataParallel owner reduces the last one's gradients as they arrive); then the owner's
// finish_gradients, `gradients_ready`, and apply(lr, optim.grad_clip). The runner itself never waits
// on a GPU: the batches go through pinned memory, the losses are summed on the device and returned
// unread. Its owner may (LocalOptimizer keeps its norm on the device; DataParallel reads its own).
#pragma once

#include <optional>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "model/transformer.h"
#include "protocols/optimizer_owner.h"
#include "protocols/step_runner.h"

namespace tessera {

class PlainStep final : public StepRunner {
 public:
  PlainStep(TransformerLM model, ResidentOwner& owner, c10::Device device, std::optional<at::ScalarType> autocast,
            double grad_clip);

  StepLosses run(const std::vector<Batch>& micro_batches, double lr, const GradientsReady& gradients_ready) override;
  double evaluate(const std::vector<Batch>& batches) override;

 private:
  // The model's forward of `batch` on the device, under autocast.
  ModelOutput forward(const Batch& batch);

  TransformerLM model_;
  ResidentOwner& owner_;
  c10::Device device_;
  std::optional<at::ScalarType> autocast_;
  double grad_clip_;
};

}  // namespace tessera
