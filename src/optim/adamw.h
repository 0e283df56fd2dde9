// AdamW (Loshchilov & Hutter, decoupled weight decay), the formula of torch.optim.AdamW:
//
//   t += 1
//   p *= 1 - lr * wd                                (only parameters with dim() >= 2)
//   m  = beta1 * m + (1 - beta1) * g                (exp_avg, shape of p)
//   v  = beta2 * v + (1 - beta2) * g * g            (exp_avg_sq, shape of p)
//   p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
//
// Two implementations of the same update: with options.fused, one at::_fused_adamw_ call per
// (device, dtype, decays) group of parameters (the kernel does not count steps, so the float32
// step tensors are advanced first with _foreach_add_, as torch/optim/adam.py does); otherwise
// per-tensor ops in the order of torch.optim.AdamW(foreach=False), which the tests use as the
// cross-check. State per parameter: exp_avg, exp_avg_sq (dtype and device of p) and step
// (float32 scalar on p's device). Weight decay follows `decay` (one flag per parameter) when given,
// else decays(p).
#pragma once

#include <map>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "optim/optimizer.h"

namespace tessera {

class AdamW final : public Optimizer {
 public:
  AdamW(const OptimOptions& options, NamedParams named_params, std::vector<bool> decay = {});

  void step(double lr) override;
  NamedParams state() const override;
  void load_state(const std::map<std::string, at::Tensor>& state, const std::string& source) override;
  void zero_grad() override;

 private:
  // Second moments (exp_avg_sq): non-negative.
  StateKind slot_kind(const std::string& slot) const override;
  struct Slot {
    std::string name;
    at::Tensor param, exp_avg, exp_avg_sq, step;
    bool decay;
  };
  void step_fused(double lr);
  void step_unfused(double lr);

  double beta1_, beta2_, eps_, weight_decay_;
  bool fused_;
  std::vector<Slot> slots_;
};

}  // namespace tessera
