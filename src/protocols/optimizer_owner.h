// The owners of a parallelized model's gradients and optimizer (parallel/parallelize.h picks one),
// as two interfaces, so that no owner implements a call it cannot honour:
//
// OptimizerOwner: what every owner does: the model's state for checkpoints, loading parameters,
// the step's final gradients for a reader, and visiting the parameters whole. SwapOwner
// (memory/swap/swap_owner.h) is one: its step is the swap plan's (parallel/swap_step.h).
//
// ResidentOwner: an OptimizerOwner whose model is resident on its device and whose backward the
// step runs: LocalOptimizer (one process, or tensor parallelism alone; fp16 master weights and
// loss scaling) or DataParallel (dp x sp replicas, ZeRO 0-3, offload, compression). A step, as
// the plain step runner drives it (parallel/plain_step.h):
//   for each micro-batch m of M:  owner.before_backward(m == M - 1);  (loss * loss_scale()).backward();
//   owner.finish_gradients();       // gradients final: reduced over the replicas, unscaled
//   [owner.sum_gradient_over(..)]   // a pipeline's tied embedding: its copies' gradients summed
//   [owner.gradients()]             // optional: read them (the equivalence harness does)
//   owner.apply(lr, max_norm);      // clipped, applied, zeroed
//   [or owner.drop_gradients()]     // held out of the update (step_runner.h: the ATOM swarm's rounds)
// Through a pipeline (parallel/pipeline_step.h) the schedule's actions drive the same calls: each
// B and W calls before_backward, its GATHER/RELEASE call fetch_stage/release_stage (and each
// compute action complete_stage first), and its OPTIM
// runs finish_gradients through apply. The step runners hold the owner they drive by its concrete
// interface; none asks which owner it has.
//
// State, for checkpoints (names as in this rank's model; tensor-parallel shards stay shards, the
// caller turns them whole by their declarations): "optim.<param>.<slot>", and with fp16
// "master.<param>" and "scaler.<key>".
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "checkpoint/checkpoint.h"
#include "comm/group.h"
#include "core/error.h"
#include "optim/clipping.h"
#include "model/transformer.h"
#include "optim/optimizer.h"
#include "precision/fp16.h"

namespace tessera {

// How the global gradient norm counts a model split over model-parallel ranks (tensor and
// pipeline parallelism): norm^2 = sum over the ranks of `groups` of sum_i weight_i ||g_i||^2,
// where a parameter split over a group (each rank a different part, or a different stage) has
// weight 1, one replicated on all N ranks of the tp group 1/N, so that it counts once, and a
// pipeline's second copy of the tied embedding 0. Without groups every weight is 1.
struct ModelParallelNorm {
  std::vector<comm::Group*> groups;  // the squares are summed over each in turn (tp, then pp)
  std::map<std::string, double> weight;  // by parameter name; absent: 1
  bool split() const { return !groups.empty(); }
  double weight_of(const std::string& name) const {
    const auto it = weight.find(name);
    return it == weight.end() ? 1.0 : it->second;
  }
  // Sums this rank's squares over the groups (a collective of each).
  void sum_over_groups(at::Tensor& squares) const {
    for (comm::Group* g : groups) g->all_reduce(squares);
  }
  // The global norm of `params`' gradients (a collective of the groups); `counted` receives the
  // gradients it summed, for the caller to scale. With `replicas` (per parameter: how many ranks of
  // `replicas_group` hold the same gradient) each is counted 1/replicas[i] per rank and the sum is
  // also taken over replicas_group (data parallelism with several reduction groups).
  double grad_norm(const NamedParams& params, std::vector<at::Tensor>& counted,
                   const std::vector<int64_t>& replicas = {}, comm::Group* replicas_group = nullptr) const {
    std::vector<double> weights;
    for (size_t i = 0; i < params.size(); ++i) {
      const auto& [name, p] = params[i];
      if (!p.grad().defined()) continue;
      counted.push_back(p.grad());
      weights.push_back(weight_of(name) / (replicas.empty() ? 1.0 : static_cast<double>(replicas[i])));
    }
    at::Tensor squares = weighted_squares(counted, weights, params.front().second.device());
    if (replicas_group) replicas_group->all_reduce(squares);
    sum_over_groups(squares);
    return std::sqrt(squares.item<double>());
  }
};

// The entries of `all` named "<prefix>...", with the prefix removed (a checkpoint's "optim.",
// "master.", "scaler." parts of the training state).
inline std::map<std::string, at::Tensor> with_prefix(const std::map<std::string, at::Tensor>& all,
                                                     const std::string& prefix) {
  std::map<std::string, at::Tensor> out;
  for (const auto& [name, t] : all)
    if (name.rfind(prefix, 0) == 0) out.emplace(name.substr(prefix.size()), t);
  return out;
}

// What an owner's training-state entry holds: "optim.<state>" as `optimizer` declares it,
// "scaler.<state>" as the loss scaler does, the rest (master weights) real.
inline StateKind owned_state_kind(const Optimizer& optimizer, const std::string& name) {
  const std::string optim = "optim.", scaler = "scaler.";
  if (name.rfind(optim, 0) == 0) return optimizer.state_kind(name.substr(optim.size()));
  if (name.rfind(scaler, 0) == 0) return DynamicLossScaler::state_kind(name.substr(scaler.size()));
  return StateKind::real;
}

struct UpdateResult {
  // The global norm before clipping: a float64 0-dim tensor on the host, or on the device where the
  // step queued it there unread (the training step reads it with the losses, once); undefined
  // where no update measured one (read as 0).
  at::Tensor grad_norm;
  bool skipped = false;  // fp16 overflow: no update was made
  bool applied = true;   // false: the step's gradients were held out of an update (step_runner.h)
};

class OptimizerOwner {
 public:
  virtual ~OptimizerOwner() = default;

  // The step's final gradients (reduced, unscaled, before the update), whole over the
  // data-parallel ranks (a collective where they are sharded over them), by parameter name
  // (tensor-parallel shards stay shards). Undefined tensors where a parameter got no gradient.
  virtual NamedTensors gradients() = 0;
  virtual const DynamicLossScaler* loss_scaler() const { return nullptr; }

  // Whole over the data-parallel ranks (a collective where state is sharded over them).
  virtual NamedTensors training_state() = 0;
  // Takes whole tensors, as training_state() gave them.
  virtual void load_training_state(const std::map<std::string, at::Tensor>& tensors, const std::string& source) = 0;
  // What the entry `name` of training_state() holds (core/state_kind.h), as its optimizer (and
  // loss scaler) declare it: a checkpoint reader checks each tensor by it.
  virtual StateKind state_kind(const std::string& name) const = 0;
  // The ranges of "optim.*" this rank reads on resume (its own ZeRO 1-3 slices); empty: whole.
  virtual OptimizerRanges training_state_ranges() const { return {}; }
  // Takes the tensors load_checkpoint(..., training_state_ranges()) returns (ranges not empty).
  virtual void load_training_state_ranges(const std::map<std::string, at::Tensor>& tensors,
                                          const std::string& source) {
    load_training_state(tensors, source);
  }
  // This rank's own slices of training_state(), which over the data-parallel ranks cover it
  // exactly once, without communication (DataParallel's ZeRO slices, or its even slice at stage
  // 0; possibly none on this rank); nullopt when this kind of owner has none (its state is the
  // same on every replica).
  virtual std::optional<std::vector<TensorSlice>> own_training_state_slices() const { return std::nullopt; }

  // The gradient compressor's state of this rank (empty without one); loading refuses a
  // non-empty state where there is no compressor.
  virtual NamedTensors compression_state() const { return {}; }
  virtual void load_compression_state(const std::map<std::string, at::Tensor>& tensors, const std::string& source) {
    require(tensors.empty(), source, ": gradient-compression state given, but this run has no data parallelism");
  }

  // Loading the model's parameters (a checkpoint), one at a time and without communication:
  // whether this rank keeps any of parameter `name` (a caller need not read it otherwise), its
  // whole value (in the model's local layout, after any tensor-parallel cut), then, once all
  // are loaded, parameters_loaded().
  virtual bool keeps_part_of(const std::string& name) const { return true; }
  virtual void load_parameter(const std::string& name, const at::Tensor& value) = 0;
  virtual void parameters_loaded() {}
  // Calls fn with the names of parameters that are whole (over the owner's ranks) during the call,
  // until every parameter was named once, in the same order on every rank: ZeRO-3 gathers one
  // unit per call and releases it after (a collective), so the whole model is never resident;
  // the others call fn once with every parameter.
  virtual void visit_full_parameters(const std::function<void(const std::vector<std::string>& names)>& fn) = 0;
};

class ResidentOwner : public OptimizerOwner {
 public:
  // ZeRO-3 over a pipeline stage: an owner whose gathers_by_schedule() shards the stage's
  // parameters and leaves their gathers to the pipeline schedule (ordinary ZeRO-3 of a whole model
  // gathers each block itself and answers false). fetch_stage(stage) starts
  // bringing the parameters of `stage` (its blocks, and the ends when it holds the embedding or
  // the head) in and returns with the gathers in flight; from complete_stage(stage) to
  // release_stage(stage) they are whole, sharded again after. Fetches are held and counted: a part
  // that two fetches hold (the rank's two stages sharing the ends under V placement) stays whole
  // until both released it. The pipeline schedule's
  // GATHER and RELEASE actions call fetch and release, each compute action complete;
  // begin_pass/end_pass fetch and complete, and release, every stage of the rank around an
  // evaluation. Collectives of the data replicas; nothing for the other owners.
  virtual bool gathers_by_schedule() const { return false; }
  virtual void fetch_stage(const ModelStage& stage) {}
  virtual void complete_stage(const ModelStage& stage) {}
  virtual void release_stage(const ModelStage& stage) {}
  virtual void begin_pass() {}
  virtual void end_pass() {}
  // The adaptive codecs' probe (parallel/activation_probe.h) under this owner: run_probe runs
  // `probe` with the model's forward and backward free of the step's reductions, handing it
  // `around_block`, which runs a function with one block's parameters whole. ZeRO-3 over a whole
  // model (DataParallel) gathers each block around its census forward and backward and around
  // each block's passes, holding the ends throughout: one block and the ends whole at a time, on
  // every replica at once (probes_on_every_replica: its gathers are collectives of the replicas,
  // which all probe the same micro-batch). Every other owner runs `probe` as it is.
  using AroundBlock = std::function<void(int64_t layer, const std::function<void()>& fn)>;
  virtual bool probes_on_every_replica() const { return false; }
  virtual void run_probe(const std::function<void(const AroundBlock& around_block)>& probe) {
    probe([](int64_t, const std::function<void()>& fn) { fn(); });
  }
  // The loss is multiplied by this before backward (fp16's dynamic loss scale; 1 otherwise).
  virtual double loss_scale() const { return 1.0; }
  virtual void before_backward(bool last_micro_batch) = 0;
  // before_backward for a backward that reaches the parameters of pipeline stage `stage` only (a
  // rank with several stages: DataParallel at ZeRO-2/3 then reduce-scatters that stage's units,
  // not the others' empty gradients).
  virtual void before_stage_backward(bool last_micro_batch, const ModelStage& stage) {
    before_backward(last_micro_batch);
  }
  virtual void finish_gradients() = 0;
  // Sums the final gradient of parameter `name` (this rank's part of it: whole, or its ZeRO shard)
  // over `copies`, whose ranks hold copies of one tied parameter laid out alike (a pipeline's
  // first and last stage hold the tied embedding); between finish_gradients() and apply(). A
  // collective of `copies`.
  virtual void sum_gradient_over(const std::string& name, comm::Group& copies) = 0;
  virtual UpdateResult apply(double lr, double max_norm) = 0;
  // Instead of apply(): the step's final gradients are discarded and no update is made (the caller
  // took them elsewhere: the ATOM swarm's accumulation, atom/swarm.h).
  virtual void drop_gradients() = 0;
};

// An owner holding a whole replica's training state in this one process (LocalOptimizer,
// SwapOwner), which it lets the ATOM swarm (atom/swarm.h) read and write in place: the step's final
// gradients between a step's gradients_ready and its update (batch mode: added to the swarm's
// accumulation, replaced by the round's mean) and the parameters the optimizer updates (DiLoCo's
// outer step).
class GradientHolder {
 public:
  virtual ~GradientHolder() = default;
  // The parameters the optimizer updates (the fp32 masters under fp16 or in host memory under
  // swapping), one per parameter in final_gradients()' order; live: after writing them call
  // parameters_written(), which brings the model's copies (fp16 weights, swapped bf16 copies) in line.
  virtual std::vector<at::Tensor> master_parameters() = 0;
  virtual void parameters_written() {}
  // This process's final gradients, one per parameter in an order fixed by the config (the same in
  // every process of one), as the update reads them (unscaled; live tensors: writing them changes
  // the update); a parameter that got no gradient gets zeros here, and is then updated with them.
  virtual std::vector<at::Tensor> final_gradients() = 0;
  // The autograd leaves whose .grad the backward accumulates final_gradients() into, one per
  // gradient in the same order, when it does so directly (no loss scale to remove and no copy after
  // the backward): a gradient is then final once its leaf's post-accumulate hook fired in the step's
  // last backward, and the ATOM swarm sends it from there while the backward goes on. Empty where
  // the final gradients come only after the backward (fp16's masters, a swapped model's host copies).
  virtual std::vector<at::Tensor> gradient_leaves() { return {}; }
  // After the caller wrote final_gradients() in place of the step's own (the swarm's round mean),
  // before the step's update: the update is decided on the written gradients (fp16: skipped when
  // one is not finite), while the loss scale still follows this process's own backward.
  virtual void gradients_written() {}
  // The update alone, between two steps, from gradients the caller wrote into final_gradients():
  // clipped to `max_norm` (0: not clipped) and applied at `lr`, as a step's update with these
  // gradients would be (fp16: skipped, lowering the loss scale, when one is not finite), then let
  // go. The swarm replays the rounds it missed through it (atom/round_log.h).
  virtual UpdateResult apply_written_gradients(double lr, double max_norm) = 0;
};

}  // namespace tessera
