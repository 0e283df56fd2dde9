// The step runner (protocols/step_runner.h) of a swapped model (memory.swap; ATOM, issue 14): the
// model's state lives in host memory (memory/swap/swap_owner.h) and the step's swap plan (memory/swap/swap_plan.h) runs
// through the one executor (memory/swap/swap_executor.h), whose compute actions run here:
//
//   COMPUTE_F i  sub-model 0 embeds the micro-batch's tokens, the others take the previous
//                sub-model's output as a leaf requiring grad; blocks [first, end) run under
//                autocast; the last sub-model adds the head and the loss (ce + aux) / micro-batches;
//                an earlier one with mixture-of-experts blocks keeps their auxiliary loss /
//                micro-batches as a second root of its backward.
//   COMPUTE_B i  backward of the sub-model's roots (the last: its loss; the others: their output
//                with the gradient the next sub-model's backward left on its input); its input's
//                gradient goes to sub-model i-1. The gradients it makes stay on the device until
//                its STORE_GRAD.
// The step returns with its updates still running on the host stream; the next step's LOADs wait
// for them, so they overlap its forward, and evaluate(), the timeline and the owner's state
// accessors settle them first.
// The copies go through the residency layer over the owner, the model's home in host memory
// (memory/swap/host_home.h); the host actions are the owner's jobs. Once every gradient is on the host, they are
// averaged over the data-parallel replicas (with dp > 1), the caller's `gradients_ready` runs
// (the equivalence harness reads them), then the global norm and, under clipping, the clip (the
// plan defers the updates for both); the plan's OPTIM actions update each sub-model on the host
// stream.
//
// The step equals a resident step: the same forward, the same backward (split at the sub-model
// boundaries, where autograd passes the same gradient on), gradients accumulated over the
// micro-batches in the same order, the same norm and update per parameter.
//
// memory.activation_compression = adaptive: before the first step's plan and every
// probing.every steps after, rank 0 of the replicas probes its first micro-batch (parallel/
// activation_probe.h) with the sub-models brought in as the plan brings them, never more than
// one sub-model and the ends at once: the census runs each sub-model's forward, then each one's
// backward in reverse (by torch::autograd::grad over its input: no gradient is made), loading
// the sub-model around each, and each block's passes run with its sub-model loaded. The choice is
// the step's note.
//
// evaluate(): the forward alone, sub-model by sub-model over all the batches at once, so each
// sub-model is loaded once per evaluation (not once per batch), the next one's fetch running while
// the current one computes (two resident at most, as in the training forward): a plan
// (swap::forward_only_swap_plan) run by the same executor as the step. Every batch's
// hidden state stays on the device between sub-models: eval.batches x batch x seq x n_embd
// values, beside the plan's budget (which holds the training step's activations).
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "data/sampler.h"
#include "memory/swap/swap_executor.h"
#include "memory/swap/swap_owner.h"
#include "memory/swap/swap_plan.h"
#include "model/transformer.h"
#include "parallel/activation_probe.h"
#include "protocols/step_runner.h"

namespace tessera {

// What a swap step takes beyond its plan (parallelize() fills it from the run's sections).
struct SwapStepOptions {
  double grad_clip = 0;   // optim.grad_clip
  double host_bytes = 0;  // the host memory the run's state takes (plan/swap_cut.h), for add_bench_fields
  ActivationProbing probing;  // memory.activation_compression = adaptive: where the probe runs
};

class SwapStep final : public StepRunner {
 public:
  // `plan`: the layout's sub-models and their costs (its actions are rebuilt for each step's
  // micro-batches).
  SwapStep(TransformerLM model, SwapOwner& owner, const SwapStepOptions& options, c10::Device device,
           std::optional<at::ScalarType> autocast, swap::SwapPlan plan);

  StepLosses run(const std::vector<Batch>& micro_batches, double lr, const GradientsReady& gradients_ready) override;
  double evaluate(const std::vector<Batch>& batches) override;
  // swap_step<N>.svg (measured) and swap_step<N>.planned.svg (the plan replayed with its costs).
  std::optional<std::string> write_timeline(const std::string& dir, int64_t step) override;
  // The plan's prediction against the last step's measured timeline ("swap": {...}).
  void add_bench_fields(nlohmann::json& out) override;
  std::optional<std::string> take_note() override;

  // The plan of the last run (or the planned one before any).
  const swap::SwapPlan& plan() const { return plan_; }
  // The last run's measured timeline (its updates settled first).
  const std::vector<swap::TimedAction>& timeline();
  ~SwapStep();

 private:
  void compute(const swap::Action& a, const std::vector<Batch>& batches);
  // The adaptive codecs chosen again from `batch` (above).
  void choose_activation_codecs(const Batch& batch);

  TransformerLM model_;
  SwapOwner& owner_;
  SwapStepOptions options_;
  c10::Device device_;
  std::optional<at::ScalarType> autocast_;
  swap::SwapPlan plan_;
  swap::SwapExecutor executor_;

  struct Stash {
    at::Tensor input;     // the sub-model's input leaf (undefined for sub-model 0)
    at::Tensor output;    // its output (the last: its loss), with its graph
    at::Tensor aux;       // before the last: its MoE blocks' auxiliary loss / micro-batches
    at::Tensor grad_out;  // the gradient of the output, from the next sub-model's backward
  };
  std::map<int64_t, Stash> stash_;  // by sub-model, for the micro-batch in flight
  at::Tensor ce_sum_, aux_sum_;
  swap::Timeline timeline_ = std::make_shared<std::vector<swap::TimedAction>>();
  int64_t steps_run_ = 0;
  std::optional<std::string> note_;  // the adaptive codecs' choice, for take_note
};

}  // namespace tessera
