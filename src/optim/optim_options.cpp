// OptimOptions checks and the learning-rate schedule (formulas in optim_options.h).
#include "optim/optim_options.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace tessera {

void OptimOptions::check(const std::string& source) const {
  check_ranges(*this, "optim", source);
  require(name == "adamw" || name == "adafactor" || name == "sgd", source,
          ": optim.name must be adamw, adafactor or sgd (got ", name, ")");
  require(!nesterov || momentum > 0, source, ": optim.nesterov = true needs optim.momentum > 0 (got ", momentum, ")");
  require(schedule == "cosine" || schedule == "linear" || schedule == "constant", source,
          ": optim.schedule must be cosine, linear or constant (got ", schedule, ")");
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
