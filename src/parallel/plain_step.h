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
//
// memory.activation_compression = adaptive (the model's adaptive_activation_codecs()): before the
// first step's micro-batches and every `probe_every` steps after (0: the first only), rank 0 of
// the replicas (or this process, without them) probes its first micro-batch (parallel/
// activation_probe.h's choose_activation_codecs; under tensor, sequence and expert parallelism
// with its tp, sp and ep groups, whose ranks are not among the replicas here: the ep group's
// ranks all take its rank 0's micro-batch, broadcast over it) and broadcasts the codecs chosen;
// every replica then encodes alike. Under ZeRO-3 every replica probes rank 0's micro-batch, inside
// the owner's run_probe (protocols/optimizer_owner.h), which gathers one block at a time. The choice is the step's note (take_note).
#pragma once

#include <optional>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "comm/group.h"
#include "model/transformer.h"
#include "parallel/activation_probe.h"
#include "protocols/optimizer_owner.h"
#include "protocols/step_runner.h"

namespace tessera {

class PlainStep final : public StepRunner {
 public:
  PlainStep(TransformerLM model, ResidentOwner& owner, c10::Device device, std::optional<at::ScalarType> autocast,
            double grad_clip, ActivationProbing probing = {});

  StepLosses run(const std::vector<Batch>& micro_batches, double lr, const GradientsReady& gradients_ready) override;
  double evaluate(const std::vector<Batch>& batches) override;
  std::optional<std::string> take_note() override;

 private:
  // The model's forward of `batch` on the device, under autocast.
  ModelOutput forward(const Batch& batch);

  TransformerLM model_;
  ResidentOwner& owner_;
  c10::Device device_;
  std::optional<at::ScalarType> autocast_;
  double grad_clip_;
  ActivationProbing probing_;
  int64_t steps_run_ = 0;
  std::optional<std::string> note_;
};

}  // namespace tessera
