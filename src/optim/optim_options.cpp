// OptimOptions checks and the learning-rate schedule (formulas in optim_options.h).
#include "optim/optim_options.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace tessera {

namespace {

void require_range(bool ok, const std::string& source, const char* key, const char* what, double got) {
  require(ok, source, ": optim.", key, " must be ", what, " (got ", got, ")");
}

}  // namespace

void OptimOptions::check(const std::string& source) const {
  require(name == "adamw" || name == "adafactor", source, ": optim.name must be adamw or adafactor (got ", name, ")");
  require(schedule == "cosine" || schedule == "linear" || schedule == "constant", source,
          ": optim.schedule must be cosine, linear or constant (got ", schedule, ")");
  require_range(lr > 0 && std::isfinite(lr), source, "lr", "a positive number", lr);
  require_range(min_lr_ratio >= 0 && min_lr_ratio <= 1, source, "min_lr_ratio", "in [0, 1]", min_lr_ratio);
  require_range(warmup_steps >= 0, source, "warmup_steps", ">= 0", static_cast<double>(warmup_steps));
  require_range(beta1 >= 0 && beta1 < 1, source, "beta1", "in [0, 1)", beta1);
  require_range(beta2 >= 0 && beta2 < 1, source, "beta2", "in [0, 1)", beta2);
  require_range(eps > 0, source, "eps", "> 0", eps);
  require_range(weight_decay >= 0, source, "weight_decay", ">= 0", weight_decay);
  require_range(grad_clip >= 0, source, "grad_clip", ">= 0 (0 = off)", grad_clip);
  require_range(adafactor_clip_threshold > 0, source, "adafactor_clip_threshold", "> 0", adafactor_clip_threshold);
  require_range(adafactor_decay_rate < 0, source, "adafactor_decay_rate", "negative", adafactor_decay_rate);
  require_range(adafactor_eps1 > 0, source, "adafactor_eps1", "> 0", adafactor_eps1);
  require_range(adafactor_eps2 >= 0, source, "adafactor_eps2", ">= 0", adafactor_eps2);
  require_range(adafactor_beta1 >= 0 && adafactor_beta1 < 1, source, "adafactor_beta1", "in [0, 1)", adafactor_beta1);
}

double learning_rate(const OptimOptions& o, int64_t step, int64_t total_steps) {
  if (step < o.warmup_steps) return o.lr * static_cast<double>(step + 1) / static_cast<double>(o.warmup_steps);
  if (o.schedule == "constant") return o.lr;
  const double floor = o.lr * o.min_lr_ratio;
  const double span = static_cast<double>(std::max<int64_t>(1, total_steps - o.warmup_steps));
  const double p = std::clamp(static_cast<double>(step - o.warmup_steps) / span, 0.0, 1.0);
  if (o.schedule == "linear") return floor + (o.lr - floor) * (1.0 - p);
  return floor + (o.lr - floor) * 0.5 * (1.0 + std::cos(M_PI * p));
}

}  // namespace tessera
