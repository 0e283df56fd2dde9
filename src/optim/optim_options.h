// The [optim] section: which optimizer, its hyperparameters, gradient clipping and the
// learning-rate schedule.
//
// Schedule (learning_rate below), with W = warmup_steps, T = total steps, s the 0-based step:
//   s < W:                    lr * (s + 1) / W                         (linear warmup, never 0)
//   s >= W, "constant":       lr
//   s >= W, "cosine":         min + (lr - min) * (1 + cos(pi * p)) / 2,  p = (s - W) / (T - W)
//   s >= W, "linear":         min + (lr - min) * (1 - p)
// where min = lr * min_lr_ratio and p is clamped to [0, 1], so steps past T stay at the floor.
//
// SGD (optim/sgd.h) uses lr, weight_decay (L2, added to the gradient), momentum and nesterov.
//
// Adafactor with adafactor_relative_step = true computes its own step size
// min(1e-2, 1/sqrt(t)) and ignores the schedule's lr (HF transformers semantics).
#pragma once

#include <cstdint>
#include <string>
#include "core/options.h"

namespace tessera {

struct OptimOptions {
  std::string name = "adamw";
  double lr = 1e-3;
  double min_lr_ratio = 0.1;
  int64_t warmup_steps = 20;
  std::string schedule = "cosine";
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  double grad_clip = 1.0;
  bool fused = true;
  double momentum = 0.9;
  bool nesterov = false;
  bool adafactor_relative_step = true;
  double adafactor_clip_threshold = 1.0;
  double adafactor_decay_rate = -0.8;
  double adafactor_eps1 = 1e-30;
  double adafactor_eps2 = 1e-3;
  double adafactor_beta1 = 0.0;
  bool adafactor_scale_parameter = true;

  template <class V>
  void visit(V& v) {
    v("name", name, "optimizer: adamw, adafactor or sgd");
    v("lr", lr, "peak learning rate (after warmup)", above(0, 10));
    v("min_lr_ratio", min_lr_ratio, "final learning rate as a fraction of lr (cosine and linear schedules)", between(0, 1));
    v("warmup_steps", warmup_steps, "steps of linear warmup from lr/warmup_steps to lr", between(0, 1e12));
    v("schedule", schedule, "after warmup: cosine, linear (both decay to lr*min_lr_ratio) or constant");
    v("beta1", beta1, "AdamW first-moment decay", fraction_below_one());
    v("beta2", beta2, "AdamW second-moment decay", fraction_below_one());
    v("eps", eps, "AdamW denominator epsilon", above(0, 1));
    v("weight_decay", weight_decay, "decoupled weight decay, applied to parameters with 2+ dims only", between(0, 10));
    v("grad_clip", grad_clip, "clip the global gradient L2 norm to this value (0 = off, norm still measured)", between(0, 1e6));
    v("momentum", momentum, "SGD momentum (0 = plain SGD, no state)", fraction_below_one());
    v("nesterov", nesterov, "SGD with Nesterov momentum (needs momentum > 0)");
    v("fused", fused, "AdamW through the fused ATen kernel (_fused_adamw_) instead of per-tensor ops");
    v("adafactor_relative_step", adafactor_relative_step,
      "Adafactor step size min(1e-2, 1/sqrt(t)), ignoring lr and its schedule");
    v("adafactor_clip_threshold", adafactor_clip_threshold, "Adafactor update clipping: RMS(update) <= this", above(0, 1e6));
    v("adafactor_decay_rate", adafactor_decay_rate, "Adafactor second-moment decay beta2_t = 1 - t^decay_rate (< 0)", Range{-10, 0, false, true});
    v("adafactor_eps1", adafactor_eps1, "Adafactor epsilon added to squared gradients", above(0, 1));
    v("adafactor_eps2", adafactor_eps2, "Adafactor floor on RMS(parameter) when scaling the step", between(0, 1));
    v("adafactor_beta1", adafactor_beta1, "Adafactor first-moment decay (0 = no first moment)", fraction_below_one());
    v("adafactor_scale_parameter", adafactor_scale_parameter,
      "Adafactor step scaled by max(adafactor_eps2, RMS(parameter))");
  }
  void check(const std::string& source) const;
};

// The learning rate for 0-based `step` of a run of `total_steps` optimizer steps (formula above).
double learning_rate(const OptimOptions& options, int64_t step, int64_t total_steps);

}  // namespace tessera
