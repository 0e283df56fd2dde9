// The step runner (protocols/step_runner.h) of a pipeline of model stages: this rank's part of the
// model (a TransformerLM built for the layout's stage_of(rank), plan/layout.h: one stage, or
// several with virtual stages) runs the compute actions of the layout's schedule
// (parallel/pipeline/) through the one executor, which moves activations and their gradients
// between the ranks of the pp group. An action (op, stage s, micro-batch j) runs the blocks of
// stage s only:
//
//   F(j)  stage 0 embeds micro-batch j's tokens, the others take the incoming activation as a
//         leaf requiring grad; the stage's blocks run; the last stage adds the head and the loss
//         (ce + aux) / micro-batches; an earlier stage with mixture-of-experts blocks keeps their
//         auxiliary loss / micro-batches as a second root of its backward. Activations and
//         their gradients travel in parallel.pp_transfer_dtype: the compute dtype (bf16 under
//         autocast: half the bytes) or float32; either way a stage takes its input as a float32
//         leaf, as the residual stream is in one process. Under tensor and sequence parallelism
//         each rank sends to its own tp and sp rank of the next stage (the pp group), with
//         Megatron-SP or sp > 1 only its sequence chunk (the batches given to run() are this
//         rank's columns already). A forward pipeline::held_offloaded_forwards names for the
//         rank's row (memory.resident_micro_batches, or the activation policy's choice) runs its
//         blocks with their saved activations offloaded to host memory. Under bf16 the step
//         holds one WeightCastCache (precision/autocast.h) around its schedule: every
//         micro-batch's forward of the rank's stages takes the same bf16 copy of each weight
//         while a held micro-batch keeps it, so a rank holding k micro-batches keeps one set of
//         copies where it kept k (as Megatron keeps bf16 parameters beside float32 masters); the
//         set goes with the last backward that holds it, and OPTIM's update makes the next
//         forward cast again. Not under ZeRO-3 (the owner gathers_by_schedule()), whose gathers
//         write the parameters at every fetch: each forward casts its own there.
//   B(j)  backward of the stage's output (the last stage: of its loss) with the received gradient;
//         returns the input's gradient for the previous stage.
//   I(j)  the input's gradient alone, keeping each parameterised op's output gradient for W
//         (pipeline/split_backward.h); stage 0 differentiates its embedding's output. The graph
//         is dropped but for what W needs. Under full activation checkpointing a block's
//         recomputation accumulates its parameters' gradients during I (reentrant
//         checkpointing), so the owner is told of the I as of a backward
//         (before_stage_backward(false, s)) and W computes what remains (the ends).
//   W(j)  the parameters' gradients: only the weight products (x^T dy of each linear, a layer
//         norm's), from what I kept; the graph freed.
//   GATHER(s) / RELEASE(s)  the owner's fetch_stage / release_stage of stage s (ZeRO-3 over the
//         stage's dp replicas: the layout's table has them (plan/layout.h, layout_gathers) exactly
//         when the owner gathers_by_schedule(), checked at construction; once per
//         step or, with parallel.zero3_reshard_per_microbatch, for each compute action, issued
//         one compute action ahead); the first compute action on s after a fetch calls the
//         owner's complete_stage first.
//   OPTIM the optimizer step, after the rank's sends: the owner's finish_gradients, the tied
//         embedding's copies summed, run()'s `gradients_ready`, apply(lr, optim.grad_clip).
// The optimizer owner (protocols/optimizer_owner.h) sees each backward: before_stage_backward(last,
// s) ahead of every B and W of stage s (an I touches no parameter's gradient but for the case above), `last` on this
// rank's final one, so a
// DataParallel owner reduces over the stage's dp replicas exactly as after gradient accumulation.
// The optimizer step finishes the gradients, sums the tied embedding's two copies (first and last
// stage, over the embedding group) so they stay equal, and applies them (the norm over every
// stage, the last stage's copy of wte counted once). After run() the cross-entropy sum is known on
// every rank (summed over pp).
//
// The table: the one its PipelineTable (plan/pipeline_table.h) decides, the layout's at first,
// built again with each step's micro-batch count when it changes. With
// parallel.pp_schedule_costs = measured (the default) this step measures each stage's mean F, I, W
// in step PipelineTable::kMeasuredStep, averages them over the world so every rank (every data
// replica too) offers the same costs, and offers them to the PipelineTable, which takes a table
// built for them where the simulator finds it faster. The unit-cost table splits every backward,
// so a whole one's B is the measured I + W scaled by the start-up profile's B / (I + W) for the
// stage (without a profile, under tp, sp or ep, B = I + W): where B is cheaper, the table runs
// some backwards whole (schedule_builders.h).
//
// memory.activation_compression = adaptive: before the first step's schedule and every
// options.probing.every steps after, the pipeline ranks of data replica 0 probe together
// (parallel/activation_probe.h): the census is micro-batch 0 through the stages and back
// (pipeline::census_schedule, run by the executor; each backward by torch::autograd::grad over
// the stage's input, so no gradient accumulates and the owner sees nothing), each rank probes
// the blocks of its stages, and all choose one table for the whole model; it is broadcast over
// each stage's replicas. The choice is the step's note.
//
// evaluate(): the forward alone, as a table run by the same executor (forward_only_schedule,
// schedule_builders.h: each micro-batch's stages in order on the training table's placement), the
// loss known on every rank; under ZeRO-3 the owner's begin_pass/end_pass around it.
//
// write_timeline(): the last run()'s timeline of every rank, written by pipeline rank 0 into `dir`
// as pipeline_step<N>.svg (measured), .planned.svg (the schedule simulated with the mean measured
// F, B, I and W times) and .trace.json (Chrome trace), with the measured bubble in its line. A
// collective of the pp group.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include <ATen/core/Tensor.h>

#include "comm/mesh.h"
#include "data/sampler.h"
#include "model/transformer.h"
#include "parallel/activation_probe.h"
#include "protocols/optimizer_owner.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/simulate.h"
#include "parallel/pipeline/split_backward.h"
#include "protocols/step_runner.h"
#include "plan/layout.h"
#include "plan/pipeline_table.h"
#include "core/parallel_options.h"

namespace tessera {

// What a pipeline step takes beyond the layout and its parallel options (parallelize() fills it
// from the run's sections).
struct PipelineStepOptions {
  int64_t micro_batches = 1;        // per step on this rank (train.grad_accum at this dp)
  double grad_clip = 0;             // optim.grad_clip
  bool full_checkpointing = false;  // some block of this rank recomputes fully (the key, or the activation policy)
  // memory.resident_micro_batches: the forwards pipeline::held_offloaded_forwards names for the
  // rank's row keep every block's activations through `held_offload` (0: none).
  int64_t resident_micro_batches = 0;
  std::shared_ptr<ActivationOffload> held_offload;
  ActivationProbing probing;  // memory.activation_compression = adaptive: where the probe runs
};

class PipelineStep final : public StepRunner {
 public:
  PipelineStep(TransformerLM model, ResidentOwner& owner, comm::Mesh& mesh, const ParallelOptions& parallel,
               const Layout& layout, const PipelineStepOptions& options, c10::Device device,
               std::optional<at::ScalarType> autocast);

  StepLosses run(const std::vector<Batch>& micro_batches, double lr, const GradientsReady& gradients_ready) override;
  double evaluate(const std::vector<Batch>& batches) override;
  std::optional<std::string> write_timeline(const std::string& dir, int64_t step) override;
  // After step kPredictionCheckedAtStep (plan/stage_cut.h) of a layout with a predicted step: the
  // measured pipeline part of that step (to its optimizer step) and bubble against the prediction
  // (the start-up costs simulated on this step's table), once.
  std::optional<std::string> take_note() override;
  void start_timing() override;
  // Over the timed steps (the last step when none was timed): pp_action_ms (the mean F, B, I, W
  // over every rank and step) and pp_bubble: measured (idle share of pp x the steps' time),
  // simulated (the table run with each stage's mean F, B, I, W and each rank's optimizer step, as
  // a planner predicts) and replayed (each step simulated with its own actions' measured
  // durations: what the simulator's model of the executor leaves out, such as transfer time).
  // A collective of the pp group.
  void add_bench_fields(nlohmann::json& out) override;

 private:
  at::Tensor compute(const pipeline::Action& action, const at::Tensor& input, const std::vector<Batch>& batches);
  // The adaptive codecs chosen again (parallel/activation_probe.h) from `batch`, whose census runs
  // pipeline::census_schedule on `like`'s placement.
  void choose_activation_codecs(const pipeline::Schedule& like, const Batch& batch);
  // Each stage's F, B, I, W measured in the last run(), averaged over the world (so every rank
  // offers the same), offered to table_. A collective of the world.
  void offer_measured_costs();
  // The check of predicted_costs_ against the last run (a collective of pp).
  void check_prediction();
  // The blocks (and ends) of pipeline stage `stage`.
  ModelStage stage_of(int64_t stage) const;
  // A buffer (transfer_dtype_) for the activation between two stages of `batch`'s rows.
  at::Tensor activation_buffer(const Batch& batch) const;

  // The timelines of every rank of one run() given this rank's (a collective of pp), its busy time
  // per rank and step time, and each compute op's mean duration over them.
  // costs.transfer, send, post: pipeline::transfer_costs'.
  struct Measured {
    pipeline::Simulation run;
    pipeline::ActionCosts costs;
    std::vector<pipeline::Op> ran;  // the compute ops the schedule has
  };
  // One run() of this rank: its timeline and when it started (run_schedule's `started`).
  struct Run {
    std::vector<pipeline::TimedAction> timeline;
    double started = 0;
  };
  // `transfers`: also the transfers' costs (their clocks compared by ping-pong over pp, once);
  // without, costs.transfer, send and post stay 0.
  Measured measure(const Run& mine, bool transfers = true);

  // After the owner's finish_gradients: the tied embedding's gradient summed over its two copies.
  void tie_embedding();

  TransformerLM model_;
  ResidentOwner& owner_;
  comm::Mesh& mesh_;
  comm::Group& pipe_;
  comm::Group& down_;  // "pp_down": transfers to a lower pipeline rank
  PipelineStepOptions options_;
  int64_t sequence_shards_;  // the activation's sequence is split over tp under Megatron-SP
  c10::Device device_;
  std::optional<at::ScalarType> autocast_;
  StageCut cut_;  // pp x v stages
  at::ScalarType transfer_dtype_;  // of activations and their gradients between ranks
  std::vector<at::Tensor> trained_;  // this rank's parameters that are trained (W's targets)

  // What a backward starts from, with the gradient of each.
  struct Roots {
    std::vector<at::Tensor> tensors, grads;
  };
  struct Stash {
    at::Tensor input;     // the received activation (a leaf), undefined on stage 0
    at::Tensor output;    // the stage's output (the loss on the last stage), with its graph
    at::Tensor aux;       // before the last stage: its MoE blocks' auxiliary loss / micro-batches
    at::Tensor grad_out;  // the gradient of the output received
    at::Tensor embedded;  // stage 0: its embedding's output, where its I stops
    std::optional<pipeline::SplitBackward> split;  // from I to W
    // The output with grad_out (the last stage's loss: ones), and the auxiliary loss with ones.
    Roots roots() const;
    // After I: the tensors above released, so the graph holds only what the split keeps.
    void drop_graph();
  };
  std::map<std::pair<int64_t, int64_t>, Stash> stash_;  // by (stage, micro-batch)
  std::set<std::pair<int64_t, int64_t>> held_offloaded_;  // this run's forwards offloaded (resident_micro_batches)
  size_t backwards_left_ = 0;  // this run's B and W actions not yet run on this rank
  at::Tensor ce_sum_, aux_sum_;
  int64_t micro_batches_ = 1;
  PipelineTable table_;  // the table the last run() ran (the placement: any)
  // The layout's stages' F, B, I, W from the start-up profile (predicted_costs), and the check of
  // the prediction after step kPredictionCheckedAtStep: its line for take_note and its figures.
  std::optional<pipeline::ActionCosts> predicted_costs_;
  std::optional<std::string> prediction_note_;
  std::optional<std::string> probe_note_;  // the adaptive codecs' choice, for take_note
  nlohmann::json prediction_check_;
  int64_t runs_ = 0;
  Run last_;                  // the last run()'s, this rank's
  bool timing_ = false;       // since start_timing()
  std::vector<Run> timed_;    // each timed run()'s
  std::optional<double> clock_offset_;  // pipeline::clock_offset's, measured once
};

}  // namespace tessera
