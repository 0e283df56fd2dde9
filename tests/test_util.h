// Helpers shared by tessera's tests: golden-file access, tensor comparison with a stated
// tolerance that prints the worst element on failure, and a kernel's best time.
#pragma once

#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "core/fs.h"

namespace tessera::test {

// This build's golden files (build/golden), source tree and tessera binary (test_main.cpp).
extern const char* const kGoldenDir;
extern const char* const kSourceDir;
extern const char* const kTesseraBinary;

inline std::string golden_path(const std::string& name) { return std::string(kGoldenDir) + "/" + name; }
inline SafetensorsContents golden(const std::string& name) { return read_safetensors(golden_path(name)); }
inline std::string source_path(const std::string& rel) { return std::string(kSourceDir) + "/" + rel; }

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

// The worst over the tensors of `want` of |got - want| relative to the tensor's largest |want|
// (gradients by parameter name: how far a lossy encoding moved them).
inline double worst_relative_error(const std::map<std::string, at::Tensor>& got,
                                   const std::map<std::string, at::Tensor>& want) {
  double worst = 0;
  for (const auto& [name, g] : want)
    worst = std::max(worst, (got.at(name) - g).abs().max().item<double>() / std::max(g.abs().max().item<double>(), 1e-12));
  return worst;
}

// A fresh, empty directory under the test's temporary directory, private to this process
// (ctest runs test processes in parallel).
inline std::string fresh_dir(const std::string& name) {
  auto dir = std::filesystem::path(::testing::TempDir()) /
             ("tessera_" + std::to_string(::getpid()) + "_" + name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

inline bool exists(const std::string& path) { return std::filesystem::exists(path); }

// Names of the entries of a directory.
inline std::vector<std::string> list_dir(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) names.push_back(entry.path().filename().string());
  return names;
}

// `text` with its first `from` replaced by `to` (a failure is recorded when `from` is absent).
inline std::string replaced_text(std::string text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return at == std::string::npos ? text : text.replace(at, from.size(), to);
}

// Passes when f throws tessera::Error whose message contains every one of `parts`.
inline ::testing::AssertionResult throws_naming(const std::function<void()>& f,
                                                std::initializer_list<std::string> parts) {
  try {
    f();
  } catch (const Error& e) {
    std::string message = e.what();
    for (const std::string& part : parts)
      if (message.find(part) == std::string::npos)
        return ::testing::AssertionFailure() << "message '" << message << "' lacks '" << part << "'";
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "no tessera::Error thrown";
}

// Milliseconds one call of each function takes: the mean of `calls` calls, the best of `rounds`
// such means, the functions measured in turns (a round of each, then the next round of each), so
// that a machine whose speed drifts while they are measured (this VM's does, by tens of percent
// within seconds) slows each of them alike. Comparing two functions measured one after the other
// failed CI (stop 79) and a run here (2026-12-03: the composite rotary's best 0.77 ms against
// 1.19-1.76 ms in every run alone).
inline std::vector<double> best_ms_each(const std::vector<std::function<void()>>& fs, int rounds = 15, int calls = 10) {
  std::vector<double> best(fs.size(), 1e300);
  for (int round = 0; round < rounds; ++round)
    for (size_t k = 0; k < fs.size(); ++k) {
      const auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < calls; ++i) fs[k]();
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() / calls;
      best[k] = std::min(best[k], ms);
    }
  return best;
}

}  // namespace tessera::test
