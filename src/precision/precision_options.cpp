// PrecisionOptions checks and the dtype policy helpers (precision_options.h).
#include "precision/precision_options.h"

#include <cmath>

#include "core/error.h"

namespace tessera {

void PrecisionOptions::check(const std::string& source) const {
  require(dtype == "fp32" || dtype == "bf16" || dtype == "fp16", source,
          ": precision.dtype must be fp32, bf16 or fp16 (got ", dtype, ")");
  require(loss_scale_init > 0 && std::isfinite(loss_scale_init), source,
          ": precision.loss_scale_init must be a positive number (got ", loss_scale_init, ")");
  require(loss_scale_growth_interval >= 1, source, ": precision.loss_scale_growth_interval must be >= 1 (got ",
          loss_scale_growth_interval, ")");
  require(loss_scale_growth >= 1, source, ": precision.loss_scale_growth must be >= 1 (got ", loss_scale_growth, ")");
  require(loss_scale_backoff > 0 && loss_scale_backoff < 1, source,
          ": precision.loss_scale_backoff must be in (0, 1) (got ", loss_scale_backoff, ")");
}

std::optional<at::ScalarType> autocast_dtype(const PrecisionOptions& options) {
  if (options.dtype == "bf16") return at::kBFloat16;
  return std::nullopt;
}

at::ScalarType parameter_dtype(const PrecisionOptions& options) {
  return options.dtype == "fp16" ? at::kHalf : at::kFloat;
}

}  // namespace tessera
