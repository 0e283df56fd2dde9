// LocalOptimizer: the OptimizerOwner (optimizer_owner.h) when no gradient crosses a data-parallel
// replica: one process, or tensor parallelism alone (each tp rank's gradients are exact after
// backward; parallel/tensor/tensor_parallel.h). It holds the optimizer over the model's
// parameters and, with precision.dtype = fp16, the float32 master weights and the dynamic loss
// scaler (precision/fp16.h):
//
//   finish_gradients:  tp: the gradient shares summed (parallel/tensor/gradient_shares.h);
//            fp16: unscale the model's fp16 gradients into the masters (overflow noted);
//   apply:   fp16 overflow: skip the update; otherwise
//            norm = the global gradient norm (ModelParallelNorm: under tp each rank's squares by
//            weight, summed over tp), clipped to max_norm; optimizer step at lr; fp16: masters
//            copied into the model; fp16: the scale updated (lowered after an overflow of this
//            step's backward); gradients dropped;
//   drop_gradients: the gradients dropped, no update (fp16: the scale updated as by apply);
//   gradients_written: fp16: whether to skip is read from the written master gradients (the
//            swarm's round mean), the scale still follows this step's backward;
//   apply_written_gradients: apply, with fp16's overflow read from the written master gradients.
#pragma once

#include <memory>

#include "optim/optimizer.h"
#include "parallel/tensor/gradient_shares.h"
#include "protocols/optimizer_owner.h"
#include "precision/fp16.h"
#include "precision/precision_options.h"

namespace tessera {

class LocalOptimizer : public ResidentOwner, public GradientHolder {
 public:
  // `params`: the model's named parameters (on their device, in fp16 when precision.dtype is).
  LocalOptimizer(const NamedParams& params, const OptimOptions& optim, const PrecisionOptions& precision,
                 c10::Device device, ModelParallelNorm norm = {}, GradientShares shares = {});

  double loss_scale() const override;
  void before_backward(bool last_micro_batch) override {}
  void finish_gradients() override;  // tp: shares summed; fp16: unscaled into the masters, overflow noted
  NamedTensors gradients() override;
  void sum_gradient_over(const std::string& name, comm::Group& copies) override;
  UpdateResult apply(double lr, double max_norm) override;
  void drop_gradients() override;
  std::vector<at::Tensor> final_gradients() override;
  std::vector<at::Tensor> gradient_leaves() override;  // the parameters, but under fp16 (none)
  void gradients_written() override;
  UpdateResult apply_written_gradients(double lr, double max_norm) override;
  std::vector<at::Tensor> master_parameters() override;
  void parameters_written() override;
  const DynamicLossScaler* loss_scaler() const override { return scaler_.get(); }

  NamedTensors training_state() override;
  void load_training_state(const std::map<std::string, at::Tensor>& tensors, const std::string& source) override;
  StateKind state_kind(const std::string& name) const override;

  void visit_full_parameters(const std::function<void(const std::vector<std::string>& names)>& fn) override;
  void load_parameter(const std::string& name, const at::Tensor& value) override;

 private:
  at::Tensor clip(double max_norm);

  NamedParams params_;
  std::unique_ptr<MasterWeights> master_;      // fp16 only
  std::unique_ptr<DynamicLossScaler> scaler_;  // fp16 only
  std::unique_ptr<Optimizer> optimizer_;
  ModelParallelNorm norm_;
  GradientShares shares_;
  bool overflow_ = false;           // fp16: the gradients to apply are not finite (skip the update)
  bool backward_overflow_ = false;  // fp16: this step's own backward overflowed (lower the scale)
};

}  // namespace tessera
