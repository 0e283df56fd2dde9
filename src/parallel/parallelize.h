// parallelize(): the one place that applies parallelism to a single-device model, and the one
// layout validator. A parallelism is added by adding a component here, not by editing the trainer.
//
// The order (each step sees the model the previous ones left):
//   0. random streams (core/random_streams.h), seeded from train.seed and the rank's coordinates:
//      the shared stream equal within a tp group and different across replicas (pp, dp, sp), the
//      model-parallel stream different on every rank; under tp the attention dropout draws from
//      the model-parallel stream, and under Megatron-SP the residual dropout too (its activations
//      are sequence chunks); the model was built (and initialised) before, from train.seed alone;
//   1. tensor parallelism (parallel.tp): parameters sharded by their declarations (on the meta
//      device: shapes only), the layers' regions and the model's ends installed
//      (parallel/tensor/tensor_parallel.h);
//   2. sequence parallelism (parallel.sp): the attention kernels of sp_method, on each rank's
//      tensor-parallel heads (parallel/sequence/sequence_parallel.h);
//   3. pipeline stages (parallel.pp): the model was built as this rank's stage of the layout's
//      cut (plan/layout.h) by the caller; here the clipping norm spans the stages (the last
//      stage's copy of the tied embedding counted once) and the state functions below work per
//      stage (the ranks holding a stage, its dp replicas, write its tensors; loading takes the
//      stage's tensors by name, so a checkpoint loads at any pp); the schedule runs in the
//      pipeline step runner (parallel/pipeline_step.h), whose stages may be split over tp (and
//      Megatron-SP) and sp as above. With dp or sp the owner below is DataParallel over the
//      stage's replicas (ZeRO 0-3, stage 3 gathering the stage once per pass; the tied embedding a
//      unit of its own);
//   3b. expert parallelism (parallel.ep): each MoE layer keeps its rank's experts (on the meta
//      device) and dispatches tokens to the ranks holding theirs (parallel/expert/expert_parallel.h);
//      DataParallel reduces the expert gradients over the expert-data-parallel group;
//   then the parameters materialised: this rank's parts only (materialize() below), or under
//   ZeRO-3 by DataParallel one unit at a time, sharded as it goes;
//   4. activation checkpointing, compression and offload (memory.activation_checkpointing,
//      memory.activation_compression, memory.activation_offload, or under
//      memory.activation_policy = auto the layout's choice per block), inside every block;
//   5. the optimizer owner (protocols/optimizer_owner.h) and the step runner that drives it
//      (protocols/step_runner.h): SwapOwner and SwapStep under memory.swap (the model's state in
//      host memory, the step run by the layout's swap plan; its dp replicas reduce in host
//      memory), else a ResidentOwner driven by PipelineStep under pp or PlainStep: DataParallel
//      when gradients are reduced over several replicas (dp x sp > 1) or offloaded (ZeRO 0-3,
//      offload and compression inside it; at stage 3 its block wrapper gathers outside the
//      checkpointing), else LocalOptimizer (one process or tp alone; fp16 master weights and loss
//      scaling). Under tp either one counts the clipping norm by the parameters' declared splits.
//
// The layout is checked before (parallel/layout_check.h).
//
// The result, ParallelModel, is what the training step drives: the model, its step runner and
// owner, this rank's share of the data (sequence chunk, data-parallel rows), and the model and
// optimizer state in a form independent of the layout (whole tensors under the model's own names,
// for checkpoints that load at any layout), each turned whole or cut to this rank's part by the one
// routine in parallel/parameter_placement.h (tp, ep and pp) and the owner (ZeRO). The layout
// (plan/layout.h) is the caller's, computed once; parallelize() reads it and keeps a copy.
#pragma once

#include <functional>
#include <map>
#include <set>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "checkpoint/checkpoint.h"
#include "comm/mesh.h"
#include "model/transformer.h"
#include "memory/residency/flat_unit.h"
#include "protocols/optimizer_owner.h"
#include "parallel/parameter_placement.h"
#include "protocols/step_runner.h"
#include "parallel/tensor/tensor_parallel.h"
#include "plan/layout.h"
#include "config/config.h"

namespace tessera {


class ParallelModel {
 public:
  ParallelModel(const ParallelModel&) = delete;
  ParallelModel& operator=(const ParallelModel&) = delete;
  ~ParallelModel();

  TransformerLM& model() { return model_; }
  OptimizerOwner& owner() { return *owner_; }
  // The owner as a GradientHolder (optimizer_owner.h) when it is one (one process: LocalOptimizer,
  // SwapOwner), else null.
  GradientHolder* gradient_holder() { return holder_; }
  StepRunner& runner() { return *runner_; }
  const Layout& layout() const { return layout_; }

  // This rank's columns of a [B, T] token batch: its contiguous chunk [r T/sp, (r+1) T/sp) under
  // sequence parallelism (setting the model's position offset to r T/sp), all of them otherwise.
  at::Tensor local_tokens(const at::Tensor& tokens);
  // The mean of `values` over the ranks that ran different data (dp x sp); a collective of them,
  // nothing without.
  void average_over_replicas(at::Tensor& values);
  // The MoE layers' routing statistics since reset_moe_statistics() (model/moe.h): per MoE layer
  // of the whole model, summed over every rank that routes (a collective of the world; the tp
  // ranks of a replica count once). Empty for a dense model.
  std::vector<MoELayerStatistics> moe_statistics();
  void reset_moe_statistics();
  // Aux-loss-free balancing (model.moe_bias_update_rate > 0): moves each held MoE layer's
  // selection bias by the step's loads (`step`: moe_statistics(), the same on every rank).
  void balance_experts(const std::vector<MoELayerStatistics>& step);
  // Data-parallel ranks and this rank's place among them (evaluation splits a batch's rows).
  int64_t data_ranks() const;
  int64_t data_rank() const;
  // Seeds this rank's random streams (core/random_streams.h) from train.seed, `step` and the rank's
  // coordinates: parallelize() does it with step 0; a resume that finds no saved states for this
  // rank does it with the checkpoint's step.
  void seed_random_streams(int64_t step);

  // The model's parameters in Hugging Face names (model/hf_names.h), whole whatever the layout
  // (tensor-parallel shards gathered, ZeRO-3 gathered): a collective.
  NamedTensors model_state();
  // This rank's share of the model for a checkpoint written as one file per rank
  // (checkpoint/checkpoint.h): under export names, each tensor whole in exactly one rank's share,
  // or under tp each rank's part of a split tensor in one share of a rank holding that part (its
  // region recorded), assigned by size, the same on every rank; under pp among the ranks holding
  // the stage, over its own tensors, the tied embedding the first stage's. A collective of every
  // rank under ZeRO-3 (units are gathered over the replicas); nothing is gathered over tp, so no
  // rank holds more than its share and one ZeRO-3 unit beyond its training state.
  std::vector<TensorSlice> model_state_shard();
  // Loads the model from export-named tensors (a missing or unexpected one is refused, naming
  // reader.source). Each rank reads only the tensors it keeps a part of (under ZeRO-3 those
  // overlapping its shards), one at a time, and of a tensor-parallel tensor only its part's
  // region (when the stored shape is the model's), so no rank holds the whole model, nor, from
  // a checkpoint saved in parts, a whole split tensor. No communication.
  void load_model_state(const ModelReader& reader);

  // The final gradients of this step (between the owner's finish_gradients and apply) under the
  // model's parameter names, whole whatever the layout (a collective of every rank); zeros where
  // a parameter got no gradient. Under pp gathered over the stages.
  NamedTensors gradients();

  // The owner's state with tensor- and expert-parallel parts gathered whole (a collective), and
  // the routing state (routing_state()).
  NamedTensors training_state();
  // Takes load_checkpoint(..., training_state_ranges()) tensors: this rank's regions (1-D; a
  // tensor-parallel part is reshaped here for an owner that takes whole tensors), or whole tensors.
  void load_training_state(const std::map<std::string, at::Tensor>& tensors, const std::string& source);
  // What this rank reads on resume: its own ZeRO 1-3 slices, under tp as regions of the whole
  // tensors (its part, or its ZeRO range of its part); empty (whole) without either.
  OptimizerRanges training_state_ranges() const;
  // What an entry of training_state() holds (core/state_kind.h): the owner's declaration (the routing
  // state is real).
  StateKind state_kind(const std::string& name) const;
  // This rank's slices of the training state for a checkpoint of one file per rank
  // (checkpoint/checkpoint.h; under pp its own stage's state, the tied embedding's by the first
  // stage): the owner's own slices when it has them (no communication; under tp or ep regions of
  // this rank's part, a tensor not split written by tp rank 0, an expert's scalar by ep rank 0);
  // otherwise the owner's state, each tensor (under tp or ep each rank's part) written by one rank
  // holding it, assigned by size. Nothing is gathered over tp or ep. The routing state is written
  // by each stage's replica at dp = sp = tp = 0.
  std::vector<TensorSlice> training_state_slices();

 private:
  friend std::unique_ptr<ParallelModel> parallelize(TransformerLM model, comm::Mesh* mesh, const Config& config,
                                                    const Layout& layout, c10::Device device, uint64_t init_seed);
  ParallelModel(TransformerLM model, comm::Mesh* mesh, const Config& config, const Layout& layout, c10::Device device,
                uint64_t init_seed);
  // Each (meta) parameter's initial value on `where`: drawn whole, one parameter at a time, and
  // cut by the placement (parameter_placement.h), so each rank allocates only its own part and
  // holds it exactly as the whole model's (model/init.h: the values depend on the seed and the
  // name only).
  InitialValues initial_values(const at::TensorOptions& where, uint64_t seed) const;
  // Gives every (meta) parameter its storage from `initial`, one at a time. (ZeRO-3 leaves the
  // model on meta for DataParallel, which fills and shards one unit at a time.)
  void materialize(const InitialValues& initial);
  Config config_;
  Layout layout_;
  TransformerLM model_;
  comm::Mesh* mesh_;
  c10::Device device_;
  // A piece of a checkpoint: `numel` elements of chunk `index` of a tensor split over group `over`
  // (tp or ep), held by the ranks whose coordinate there divided by `replicas` is `index`, or of
  // a tensor every rank of the stage holds (`over` null).
  struct Piece {
    int64_t numel;
    comm::Group* over;
    int64_t index;
    int64_t replicas;  // ranks of `over` holding the chunk (replicated key/value heads: N / K)
  };
  // The model's routing state (TransformerLMImpl::routing_state: the held MoE layers' selection
  // biases), kept whole, written by the replica at dp = sp = tp = 0 of each stage.
  NamedTensors routing_state() const;
  // Takes the held layers' biases from `tensors` (entries for other layers are another stage's).
  void load_routing_state(const std::map<std::string, at::Tensor>& tensors);
  // The owner's state as training_state_slices() writes it (without the routing state).
  std::vector<TensorSlice> state_slices();
  // Every part of the tensor of `region` split over `over` (one piece when `over` is null).
  static void add_pieces(std::vector<Piece>& pieces, const Region& region, comm::Group* over);
  // The writer of each piece: to the rank holding its stage (and that part) with the fewest
  // elements so far. The same on every rank.
  std::vector<int64_t> writers(const std::vector<Piece>& pieces) const;
  // Whether this rank holds the part of `piece`.
  bool holds(const Piece& piece) const;
  comm::Group* tp_ = nullptr;        // tp > 1
  std::unique_ptr<comm::Group> kv_replicas_;  // the tp ranks sharing this rank's key/value heads
  comm::Group* ep_ = nullptr;        // ep > 1: the experts' group
  comm::Group* pp_ = nullptr;        // pp > 1: this rank holds its stages of the cut
  comm::Group* replicas_ = nullptr;  // dp x sp > 1 (or offload): the owner reduces over it
  int64_t sp_ = 1, sp_rank_ = 0;
  int64_t replica_ = 0, tp_rank_ = 0;  // the random streams' coordinates (seed_random_streams)
  std::unique_ptr<ParameterPlacement> placement_;  // once tp_ and pp_ are known: whole <-> part
  std::unique_ptr<OptimizerOwner> owner_;
  GradientHolder* holder_ = nullptr;  // owner_, when it is one
  std::unique_ptr<StepRunner> runner_;  // drives owner_ (declared after it: destroyed first)
};

// Applies every parallelism of `config` to `model` over `mesh` (null: one process) in the order
// above. `model` is the layout's stage_of() this rank, built on the meta device (nothing
// allocated); after the model-parallel steps (1-3) each parameter is materialised as this rank's
// part only, on `device` (in host memory under memory.swap) in the parameter dtype, initialised
// from `init_seed` (model/init.h's draw_model_seed() right after torch::manual_seed(train.seed):
// the values a model built whole there would have). Every rank calls it with equal arguments.
std::unique_ptr<ParallelModel> parallelize(TransformerLM model, comm::Mesh* mesh, const Config& config,
                                           const Layout& layout, c10::Device device, uint64_t init_seed);

}  // namespace tessera
