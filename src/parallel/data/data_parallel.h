// DataParallel: data parallelism over the mesh's "dp" group, with ZeRO stages 0-3, applied to a
// single-device model from outside. It owns the optimizer (of the shard this rank updates) and is
// the OptimizerOwner (protocols/optimizer_owner.h) parallelize() gives the training step whenever
// gradients are reduced over several replicas (or offloaded).
//
// One training step, as a step runner drives it (PlainStep, parallel/plain_step.h; PipelineStep
// calls before_stage_backward per stage instead):
//   for each micro-batch m of M:  dp.before_backward(m == M - 1);  loss.backward();
//   dp.finish_gradients();             // every reduction done; gradients are the dp mean, the
//                                      // tp shares summed (gradient_shares.h)
//                                      // (needs before_backward(true) for the last micro-batch)
//   norm = dp.clip_grad_norm(max);     // the global norm, over all ranks' shards
//   dp.step(lr);                       // update, then parameters are whole again (stages 0-2)
//   dp.zero_grad();
// (apply(lr, max) is the last three in one.) Under tensor parallelism the model is already
// sharded over tp (any stage: each unit flattens this rank's tp shards) and the clipping norm
// counts each parameter by its ModelParallelNorm weight, summed over tp as well as over the dp
// shards.
//
// Stages (Rajbhandari et al., ZeRO; bytes per parameter for fp32 training with Adam, N = dp):
//   0  DDP: gradients bucketed (parallel.bucket_mb, in reverse registration order) and
//      all-reduced while backward is still running, from gradient-ready hooks. No communication
//      on micro-batches before the last. Every rank holds everything: 4 + 4 + 8 bytes.
//   1  optimizer state sharded: gradients all-reduced as in 0, each rank updates its 1/N of the
//      flattened parameters, then the parameters are all-gathered: 4 + 4 + 8/N.
//   2  + gradients sharded: each unit's gradients are reduce-scattered as soon as backward has
//      produced them all and the full gradients are freed; a rank keeps only its shard:
//      4 + (4 + 8)/N.
//   3  + parameters sharded: each transformer block's parameters are all-gathered just before
//      its forward (the next block's gather is issued ahead, as prefetch), freed after it, and
//      gathered again for its backward, and so are the ends'; (4 + 4 + 8)/N plus the units in
//      flight.
//   parallel.offload = true with stages 1-3 (ZeRO-Offload, Ren et al.): the optimizer state, a
//      float32 master copy of the shard and the shard's gradient move to the host
//      (memory/offload/offload.h), and the optimizer step runs there. Device bytes: stage 1
//      4 + 4, stage 2 4 + 4/N, stage 3 (4 + 4)/N plus the units in flight; host bytes:
//      (4 + 4 + 8)/N.
// A pipeline stage's model (TransformerLMImpl::stage) has the units of its own blocks and ends,
// and its tied embedding (wte on the first or the last stage) is a unit of its own, so both stages
// shard it alike and sum_gradient_over can add their gradient shards. At stage 3 a pipeline
// stage's units go through the same residency layer (memory/residency/residency.h) held by the
// schedule instead of a plan: its GATHER fetches them (fetch_stage: the all-gathers start and the
// schedule goes on, one compute action ahead of the action that needs them), each compute action
// completes them (complete_stage) and RELEASE drops them (release_stage): once per step and kept
// for every micro-batch, or around each compute action with
// parallel.zero3_reshard_per_microbatch. Holds are counted per part, so the ends two stages of a
// rank share stay whole while either needs them; the gradients are reduce-scattered per unit as
// at stage 2; the ZeRO-3 plan and its wrappers serve the whole model only.
// Sharding is per unit (one unit per transformer block, one for the ends), each unit flattened
// and padded to a multiple of N, rank r owning elements [r * S, (r + 1) * S) of every unit
// (flat_unit.h). At stages 1-3 the model's parameters become views of their unit's flat buffer.
//
// Reduction groups (ReductionGroups below; each parameter's is declared, model/parameter_spec.h):
// a parameter's gradient is summed over its group only, its bucket or unit holds parameters of
// that group only (a block with experts has two units), and its shard is 1/|group| of it. N above
// is the parameter's group's size: every replica ("data") or, for experts, the replicas holding
// the same experts ("expert_data", dp / ep of them). The sum is divided by the number of data
// replicas (|data|) for every group: under expert parallelism an expert's gradient arrives
// already summed over the tokens of its ep group's ranks (the dispatch all-to-all's backward,
// parallel/expert/expert_parallel.h), so the sum over its edp replicas covers every replica's
// tokens once, and dividing by |data| gives the one-process mean. The ranks outside a parameter's
// group hold different parameters (other experts), so the clipping norm sums every rank's share
// over `data`.
// The constructor broadcasts each parameter from its group's first rank (a materialised model).
//
// Details the stages above leave open:
// - Stages 0-1 send nothing before the last micro-batch (gradients accumulate locally, in the
//   buckets). Stages 2-3 reduce-scatter every micro-batch, accumulating into the shard, so a full
//   gradient never outlives its unit's backward (as DeepSpeed does). A pipeline rank with several
//   stages (interleaved, V placement) says which stage a backward covers
//   (before_stage_backward): only that stage's units are reduce-scattered after it, and a unit
//   whose last backward was not the rank's last is divided by N in finish_gradients.
// - Stage 3 brings each unit in around its uses by a residency plan (memory/residency/): the
//   blocks' around their forward and again for their backward, the ends' (embeddings, final
//   norm; wte is tied to the head) around the embedding, then again from the last block's forward
//   through the head's backward. Blocks are gathered through a block wrapper and the ends through
//   an end wrapper (TransformerLMImpl::add_block_wrapper, add_end_wrapper), so wrappers added
//   later (a pipeline stage, a swap engine) compose outside them. Outside a pass every parameter
//   is released (its storage is empty): read them through visit_full_parameters() and
//   write them through load_parameter().
//   The constructor broadcasts rank 0's parameters, or, given a meta model and its initial
//   values, fills and shards one unit at a time (every replica draws the same values).
// - At stages 0-1 each parameter's .grad is a view of its bucket: zero them with zero_grad() here,
//   never by resetting the grads (model->zero_grad()); a gradient found elsewhere throws.
// - parallel.grad_compression (stage 0 only) averages each bucket with the compressor instead of
//   the all-reduce, launched from the same hooks: the compressor runs on the dp group's
//   communication thread as one composite operation per bucket (comm::Group::run_async), so its
//   compute and collectives overlap the rest of backward and stay in the group's order.
// - Offload: this rank's gradient shard is copied to the host once it is the dp mean: stage 1 per
//   bucket in finish_gradients, stages 2-3 per unit as its reduce-scatter of the last micro-batch
//   is collected (during backward; with N > 1 the host collects a finished reduce-scatter when a
//   later unit launches its own or in finish_gradients). clip_grad_norm takes the same global norm
//   (stage 1 over the device gradients, stages 2-3 over the host shards) and scales the host
//   gradients; step() updates the host masters with the optimizer, copies them into the device
//   shards and then all-gathers as without offload. On CUDA the host buffers are pinned and both
//   directions run non_blocking on a copy stream of their own: the device-to-host copies overlap
//   the rest of backward (stages 2-3) and the host waits for them before clipping and the step;
//   the compute stream waits for the host-to-device copies before the all-gather. On a CPU device
//   the same path runs with synchronous copies. Optimizers with elementwise state only, AdamW or
//   SGD (refused for stage 0 and for Adafactor: check_data_parallel).
// - A backward needs before_backward() first (a gradient arriving otherwise throws).
//
// Equivalence: with the same global batch (N ranks x batch_size each against one process with
// N x batch_size), losses and parameters match the single-process run to float32 rounding
// (tests/distributed/test_data_parallel.cpp states the tolerance).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "checkpoint/checkpoint.h"
#include "comm/group.h"
#include "core/parallel_options.h"
#include "memory/residency/flat_unit.h"
#include "model/transformer.h"
#include "optim/optimizer.h"
#include "parallel/tensor/gradient_shares.h"
#include "protocols/optimizer_owner.h"

namespace tessera {

// Refuses, naming the keys, what DataParallel cannot run: zero_stage outside 0-3, offload at stage
// 0 or with Adafactor, Adafactor at stages 1-3, compression at stages 1-3. The layout validator
// (parallel/parallelize.h) and DataParallel's constructor call it.
void check_data_parallel(const ParallelOptions& parallel, const OptimOptions& optim);

// The groups that average gradients, by declared ReductionGroup: `data` every replica of the
// model (dp, or dp x sp), `expert_data` (null, or the same group: as data) the replicas holding the
// same experts, a subgroup of data (edp, or edp x sp). Both outlive the DataParallel.
struct ReductionGroups {
  ReductionGroups(comm::Group& data, comm::Group* expert_data = nullptr) : data(&data), expert_data(expert_data) {}
  comm::Group* data;
  comm::Group* expert_data;
};

class DataParallel : public ResidentOwner {
 public:
  // Registers the hooks on `model` (already on its device). Throws tessera::Error naming the key
  // for combinations that are not supported (check_data_parallel). `norm`: how the clipping norm
  // counts tensor-parallel shards (none without tensor parallelism); `shares`: the gradients a tp
  // rank holds its share of, summed over tp in finish_gradients. At stage 3 `model` may still
  // be on the meta device, with `initial` giving each parameter's value (this rank's tp/pp part,
  // the same on every replica): each unit is then filled from them and sharded in turn, so set-up
  // never holds more than one unit whole beyond the shards (and no broadcast is needed).
  DataParallel(TransformerLM model, ReductionGroups groups, const ParallelOptions& parallel, const OptimOptions& optim,
               ModelParallelNorm norm = {}, GradientShares shares = {}, const InitialValues* initial = nullptr);
  ~DataParallel() override;

  void before_backward(bool last_micro_batch) override;
  void before_stage_backward(bool last_micro_batch, const ModelStage& stage) override;
  void finish_gradients() override;
  bool probes_on_every_replica() const override;
  void run_probe(const std::function<void(const AroundBlock& around_block)>& probe) override;
  bool gathers_by_schedule() const override;
  void fetch_stage(const ModelStage& stage) override;
  void complete_stage(const ModelStage& stage) override;
  void release_stage(const ModelStage& stage) override;
  void begin_pass() override;
  void end_pass() override;
  double clip_grad_norm(double max_norm);
  void step(double lr);
  void zero_grad();

  // Optimizer state as whole tensors named like Optimizer::state() ("<param>.exp_avg", ...), the
  // same on every rank and independent of N and the stage (a collective: every rank calls it).
  // At stage 0 these are the optimizer's live tensors (copy them before the next step), at
  // stages 1-3 fresh ones.
  NamedParams full_optimizer_state();
  // This rank's part of full_optimizer_state() as slices of its whole tensors, without any
  // communication or copy of the whole state (for a sharded checkpoint): stage 0 even slices over
  // each parameter's reduction group (every rank of it holds everything), stages 1-3 the range of
  // each "<param>.<slot>" this rank owns and each "<param>.step" from the rank owning the
  // parameter's first element. Over the ranks of a parameter's reduction group every element of
  // its state is in exactly one slice (under expert parallelism, of this rank's experts' state).
  std::vector<TensorSlice> optimizer_state_slices() const;
  // Each rank takes its shard of whole-tensor state (as full_optimizer_state() returns).
  void load_full_optimizer_state(const std::map<std::string, at::Tensor>& state, const std::string& source);
  // What a resume reads at stages 1-3: for every "<param>.<slot>" the range of it this rank owns
  // (empty where it owns none). Empty at stage 0, which needs the whole tensors.
  OptimizerRanges optimizer_state_ranges() const;
  // Loads state read with optimizer_state_ranges() (load_checkpoint's `ranges`): each
  // "<param>.<slot>" the 1-D tensor of exactly its range, each "<param>.step" whole.
  void load_optimizer_state_ranges(const std::map<std::string, at::Tensor>& state, const std::string& source);
  // Stage 3: one unit at a time (gathered for the call, released after unless it was resident);
  // stages 0-2: every parameter in one call.
  void visit_full_parameters(const std::function<void(const std::vector<std::string>& names)>& fn) override;
  // Loading a parameter's whole value (a checkpoint): stages 0-2 copy it into the parameter; stage
  // 3 into this rank's owned slice of its unit's shard only (and the gathered unit, if resident).
  bool keeps_part_of(const std::string& name) const override;
  void load_parameter(const std::string& name, const at::Tensor& value) override;
  // With offload (stages 1-3): copies the shards into the host masters the optimizer updates.
  void parameters_loaded() override;

  // The gradient compressor's state (error-feedback residuals, PowerSGD's Q), this rank's own;
  // empty without compression. Loading refuses entries when there is no compressor.
  NamedParams compression_state() const override;
  void load_compression_state(const std::map<std::string, at::Tensor>& state, const std::string& source) override;

  // OptimizerOwner: the optimizer state under "optim." (full_optimizer_state and friends).
  NamedTensors gradients() override;
  // Stages 0-1 the parameter's gradient (a view of its bucket), stages 2-3 its unit's gradient
  // shard (a pipeline stage's tied embedding is a unit of its own); with offload the sum is copied
  // to the host again.
  void sum_gradient_over(const std::string& name, comm::Group& copies) override;
  UpdateResult apply(double lr, double max_norm) override;
  void drop_gradients() override { zero_grad(); }
  NamedTensors training_state() override;
  void load_training_state(const std::map<std::string, at::Tensor>& tensors, const std::string& source) override;
  StateKind state_kind(const std::string& name) const override;
  OptimizerRanges training_state_ranges() const override;
  void load_training_state_ranges(const std::map<std::string, at::Tensor>& tensors, const std::string& source) override;
  std::optional<std::vector<TensorSlice>> own_training_state_slices() const override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera
