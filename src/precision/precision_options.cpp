// PrecisionOptions checks and the dtype policy helpers (precision_options.h).
#include "precision/precision_options.h"

#include <cmath>

#include "core/error.h"

namespace tessera {

void PrecisionOptions::check(const std::string& source) const {
  check_ranges(*this, "precision", source);
  require(dtype == "fp32" || dtype == "bf16" || dtype == "fp16", source,
          ": precision.dtype must be fp32, bf16 or fp16 (got ", dtype, ")");
}

std::optional<at::ScalarType> autocast_dtype(const PrecisionOptions& options) {
  if (options.dtype == "bf16") return at::kBFloat16;
  return std::nullopt;
}

at::ScalarType parameter_dtype(const PrecisionOptions& options) {
  return options.dtype == "fp16" ? at::kHalf : at::kFloat;
}

}  // namespace tessera
