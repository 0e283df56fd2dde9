// fp16 training, Megatron style: half model parameters, float32 master weights, dynamic loss
// scaling. One step of the trainer:
//
//   loss = model(x)                                  (fp16 parameters and activations)
//   (loss * scaler.scale()).backward()               (fp16 grads on the model parameters)
//   found_inf = masters.copy_grads_to_master(1 / scaler.value())
//   scaler.update(found_inf)                         (all-reduce found_inf first when distributed)
//   if (!found_inf) { optimizer.step(lr); masters.copy_master_to_model(); }   (else: step skipped)
//   optimizer.zero_grad(); zero the model's grads
//
// The optimizer is built on masters.master(), never on the fp16 parameters.
//
// DynamicLossScaler follows torch.amp.GradScaler through at::_amp_update_scale_: on overflow the
// scale is multiplied by `backoff` and the count of good steps restarts; after `growth_interval`
// consecutive good steps it is multiplied by `growth` (kept only if finite). The scale is a
// float32 [1] tensor and the count an int32 [1] tensor, both on the scaler's device.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "core/state_kind.h"
#include "precision/precision_options.h"

namespace tessera {

class MasterWeights {
 public:
  using Named = std::vector<std::pair<std::string, at::Tensor>>;

  // `model_params`: the model's (fp16) leaf parameters. Masters are float32 copies on the same
  // devices, with the same names.
  explicit MasterWeights(Named model_params);

  const Named& master() const { return master_; }
  const Named& model() const { return model_; }

  // master.grad = float(model.grad) * inv_scale for each parameter with a grad (masters of
  // parameters without one get no grad), via at::_amp_foreach_non_finite_check_and_unscale_.
  // Returns whether any gradient held an inf or nan.
  bool copy_grads_to_master(double inv_scale);

  // model = half(master), after an optimizer step.
  void copy_master_to_model();

 private:
  Named model_;
  Named master_;
};

class DynamicLossScaler {
 public:
  explicit DynamicLossScaler(const PrecisionOptions& options, at::Device device = at::kCPU);

  at::Tensor scale() const { return scale_; }  // float32 [1]: multiply the loss by it
  double value() const;
  int64_t good_steps() const;
  void update(bool found_inf);

  // "loss_scaler.scale" (float32 [1]) and "loss_scaler.growth_tracker" (int32 [1]).
  std::vector<std::pair<std::string, at::Tensor>> state() const;
  // What each entry of state() holds (core/state_kind.h): the growth tracker is a counter.
  static StateKind state_kind(const std::string& name);
  // Refuses missing or extra entries, naming `source` and the tensor.
  void load_state(const std::map<std::string, at::Tensor>& state, const std::string& source);

 private:
  at::Tensor scale_, growth_tracker_, found_inf_;
  double growth_, backoff_;
  int64_t growth_interval_;
};

}  // namespace tessera
