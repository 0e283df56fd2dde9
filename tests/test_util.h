// Helpers shared by tessera's tests: golden-file access and tensor comparison with a stated
// tolerance that prints the worst element on failure.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "checkpoint/safetensors.h"

namespace tessera::test {

inline std::string golden_path(const std::string& name) { return std::string(TESSERA_GOLDEN_DIR) + "/" + name; }
inline SafetensorsContents golden(const std::string& name) { return read_safetensors(golden_path(name)); }
inline std::string source_path(const std::string& rel) { return std::string(TESSERA_SOURCE_DIR) + "/" + rel; }

// Passes when |actual - expected| <= atol + rtol * |expected| elementwise.
inline ::testing::AssertionResult all_close(const at::Tensor& actual, const at::Tensor& expected,
                                            double rtol, double atol) {
  if (actual.sizes() != expected.sizes())
    return ::testing::AssertionFailure() << "shape " << actual.sizes() << " != " << expected.sizes();
  auto a = actual.detach().to(at::kDouble), e = expected.detach().to(at::kDouble);
  auto excess = (a - e).abs() - (atol + rtol * e.abs());
  double worst = excess.max().item<double>();
  if (worst <= 0) return ::testing::AssertionSuccess();
  int64_t i = excess.flatten().argmax().item<int64_t>();
  return ::testing::AssertionFailure() << "max |diff| " << (a - e).abs().max().item<double>() << " at flat index "
                                       << i << ": actual " << a.flatten()[i].item<double>() << " expected "
                                       << e.flatten()[i].item<double>() << " (rtol " << rtol << ", atol " << atol << ")";
}

}  // namespace tessera::test
