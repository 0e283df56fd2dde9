// Adafactor (Shazeer & Stern 2018, arXiv 1804.04235), with the semantics of HF transformers'
// `Adafactor` (papers.md §7.3). For a parameter X with gradient G at its t-th step (t from 1):
//
//   beta2_t = 1 - t^decay_rate                                   (decay_rate = -0.8)
//   Q = G*G + eps1
//   dim() >= 2, shape [..., n, m]: factored second moment over the last two dims
//     R = beta2_t R + (1 - beta2_t) mean_m(Q)                    (exp_avg_sq_row, [..., n])
//     C = beta2_t C + (1 - beta2_t) mean_n(Q)                    (exp_avg_sq_col, [..., m])
//     U = G * rsqrt(R / mean_n(R))[..., n, 1] * rsqrt(C)[..., 1, m]
//   dim() < 2: V = beta2_t V + (1 - beta2_t) Q, U = G * rsqrt(V)  (exp_avg_sq, shape of X)
//   U /= max(1, RMS(U) / clip_threshold)                         (update clipping)
//   rho_t = relative_step ? min(1e-2, 1/sqrt(t)) : lr            (lr of step() ignored if relative)
//   alpha = rho_t * (scale_parameter ? max(eps2, RMS(X_{t-1})) : 1)
//   U = alpha * U; with beta1 > 0: M = beta1 M + (1 - beta1) U, U = M   (exp_avg, shape of X)
//   X -= weight_decay * alpha * X                                (only dim() >= 2; HF's form)
//   X -= U
//
// RMS(x) = ||x||_2 / sqrt(numel). Row/column means instead of the paper's sums give the same
// V = R C / sum(R). fp16/bf16 parameters are updated in fp32 and written back; state is fp32.
// alpha stays a device tensor, so a step never synchronises with the device. State per parameter:
// the slots named above and step (float32 scalar on the CPU; it is read on the host for beta2_t).
#pragma once

#include <map>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "optim/optimizer.h"

namespace tessera {

class Adafactor final : public Optimizer {
 public:
  Adafactor(const OptimOptions& options, NamedParams named_params);

  void step(double lr) override;
  NamedParams state() const override;
  void load_state(const std::map<std::string, at::Tensor>& state, const std::string& source) override;
  void zero_grad() override;

 private:
  // Second moments (exp_avg_sq, its row and column factors): non-negative.
  StateKind slot_kind(const std::string& slot) const override;
  struct Slot {
    std::string name;
    at::Tensor param;
    at::Tensor row, col;    // factored: [..., n] and [..., m]
    at::Tensor second;      // unfactored: shape of param
    at::Tensor first;       // with beta1 > 0: shape of param
    at::Tensor step;        // float32 scalar, CPU
  };
  void update(Slot& s, double lr);

  OptimOptions options_;
  std::vector<Slot> slots_;
};

}  // namespace tessera
