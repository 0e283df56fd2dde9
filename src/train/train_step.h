// One optimizer step of a single-device model, and the state it owns: the model, the mixed-
// precision machinery and the optimizer. The trainer and `tessera bench` both drive this class,
// so the benchmark times exactly what training runs.
//
// A step: for each micro-batch, forward under autocast (bf16) and backward of loss/grad_accum
// (times the loss scale in fp16); then, in fp16, unscale into the fp32 master gradients and skip
// the update on overflow; clip the global gradient norm; optimizer update at `lr`; zero grads.
//
// With a mesh whose data-parallel degree is above 1, DataParallel (parallel/data/data_parallel.h)
// owns the optimizer and the gradient reduction; the losses reported are means over the dp ranks,
// and training_state()/evaluate() are collectives (every rank calls them).
// With parallel.sp > 1 every rank of an sp group gets the same batches and runs its contiguous
// chunk of each sequence; attention crosses the chunks by LASP for linear attention
// (parallel/sequence/lasp.h) or ring attention / Ulysses for softmax attention
// (parallel/sequence/softmax_attention_sp.h). DataParallel reduces over the "dp_sp" group (the
// losses are means over it, exact when every rank's chunk has the same number of targets).
// With parallel.tp > 1 the model is sharded Megatron-style (parallel/tensor/parallelize.h): every
// tp rank runs the same batch, gradients are exact after backward and reduced over dp only; the
// clipping norm counts split parameters over tp and replicated ones once; model_state() and
// training_state() hold unsharded tensors (checkpoints are tp = 1, loadable at any tp).
// Tensor and sequence parallelism combine (dp x tp x sp): the model is sharded first, then the
// sequence-parallel kernels run on each rank's heads. Degrees this build cannot run yet (pp, ep > 1;
// megatron_sp with sp > 1; fp16 with any parallelism) are refused by key before any work.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "comm/mesh.h"
#include "data/sampler.h"
#include "model/transformer.h"
#include "optim/optimizer.h"
#include "precision/fp16.h"
#include "parallel/tensor/parallelize.h"
#include "train/config.h"

namespace tessera {

struct StepResult {
  double ce_loss = 0;   // mean over micro-batches
  double aux_loss = 0;  // MoE auxiliary terms, mean over micro-batches
  double grad_norm = 0;
  bool skipped = false;  // fp16 overflow: no update was made
};

class DataParallel;

// Refuses, naming the keys, a layout this build cannot train: pp, ep > 1; sp > 1 with a
// train.seq_len it does not divide, an sp_method that does not fit model.arch, attention dropout,
// or (Ulysses) heads it does not divide; fp16 with dp * sp > 1; with several ranks, a
// parallel.backend that does not fit train.device or the build (comm::choose_backend).
// The launcher calls it before starting workers; TrainStep again in every process.
void check_parallel_layout(const Config& config, const ParallelDims& dims);

class TrainStep {
 public:
  // Sets the intra-op threads (train.threads), seeds torch with train.seed, and builds the model
  // from config.model on train.device (refused by name when CUDA is asked for but absent).
  // `mesh` may be null (one process).
  explicit TrainStep(const Config& config, comm::Mesh* mesh = nullptr);
  ~TrainStep();

  StepResult run(const std::vector<Batch>& micro_batches, double lr);
  // Mean cross-entropy over `batches`, without gradients, in eval mode (with dp > 1, each rank
  // evaluates its share of every batch's rows).
  double evaluate(const std::vector<Batch>& batches);

  TransformerLM& model() { return model_; }
  // The model's parameters in Hugging Face names (model/hf_names.h), whole even under ZeRO-3.
  NamedTensors model_state();
  // Loads HF-named parameters (a checkpoint's model.safetensors) into the model, on every rank.
  void load_model_state(const std::map<std::string, at::Tensor>& tensors, const std::string& source);
  c10::Device device() const { return device_; }
  const DynamicLossScaler* loss_scaler() const { return scaler_.get(); }
  c10::ScalarType compute_dtype() const;

  // Optimizer, fp32 master weights and loss scaler, named "optim.", "master.", "scaler.".
  NamedTensors training_state() const;
  // Takes the tensors as load_checkpoint(..., training_state_ranges()) returns them.
  void load_training_state(const std::map<std::string, at::Tensor>& tensors, const std::string& source);
  // The optimizer ranges this rank reads on resume, named as in training_state(): its own ZeRO
  // 1-3 slices; empty (whole tensors) without ZeRO 1-3 or with tp > 1.
  OptimizerRanges training_state_ranges() const;
  // This rank's slices of training_state() for shard `rank` of a checkpoint written by `shards`
  // ranks (checkpoint/checkpoint.h). When the data-parallel replicas are the whole world and tp = 1,
  // each rank's own ZeRO slices, with no gathering (the whole optimizer state never exists on any
  // rank); otherwise the even slices of training_state() (a collective).
  std::vector<TensorSlice> training_state_slices(int64_t rank, int64_t shards) const;
  // The gradient compressor's state of this rank (parallel/data/data_parallel.h); empty without
  // data parallelism or compression. Loading refuses a non-empty state where there is none.
  NamedTensors compression_state() const;
  void load_compression_state(const std::map<std::string, at::Tensor>& tensors, const std::string& source);

 private:
  std::vector<at::Tensor> optimized_parameters() const;
  double clip_tensor_parallel(double max_norm);
  std::optional<TensorParallelLayout> moment_layout(const std::string& name, const at::Tensor& t) const;
  // This rank's part of [B, T] tokens: columns [r T/sp, (r+1) T/sp) for sp rank r; the model's
  // learned positions start at r T/sp (model/transformer.h).
  at::Tensor sequence_chunk(const at::Tensor& tokens);

  Config config_;
  c10::Device device_;
  std::optional<at::ScalarType> autocast_;
  TransformerLM model_{nullptr};
  std::unique_ptr<MasterWeights> master_;  // fp16 only
  std::unique_ptr<DynamicLossScaler> scaler_;  // fp16 only
  std::unique_ptr<Optimizer> optimizer_;    // one process
  comm::Mesh* mesh_ = nullptr;
  std::unique_ptr<DataParallel> dp_;        // dp * sp > 1
  comm::Group* replicas_ = nullptr;
  comm::Group* tp_ = nullptr;               // tp > 1: the model is sharded (parallel/tensor/parallelize.h)         // the group dp_ reduces over ("dp", or "dp_sp" with sp > 1)
  int64_t sp_ = 1, sp_rank_ = 0;
};

}  // namespace tessera
