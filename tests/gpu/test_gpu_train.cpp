// Training on a CUDA device in fp32, bf16 and fp16 through the CLI, checked beyond the exit code:
// the run says it trained in that precision on the GPU, its losses are finite and fall, and a run
// resumed at step 10 (model, optimizer, loss scale and the CUDA random streams restored) continues
// with the uninterrupted run's losses. Skipped without CUDA (and in builds with TESSERA_CUDA=OFF,
// where libtorch_cuda is not linked).
//
// Tolerance of the resumed losses: 1e-3 relative, chosen, not measured (no GPU has run this yet):
// the embedding's backward on CUDA accumulates with atomics, so two runs need not be bitwise equal.
#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <cmath>
#include <map>

#include "../cli/cli_util.h"

namespace tessera::test {
namespace {

class GpuTrain : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  }
};

std::map<int64_t, double> losses(const std::string& run_dir) {
  std::map<int64_t, double> out;
  for (const auto& line : metrics_lines(run_dir))
    if (line.contains("loss")) out[line["step"]] = line["loss"];
  return out;
}

TEST_P(GpuTrain, TrainsAndResumes) {
  const std::string precision = GetParam();
  std::string out = fresh_dir("gpu_" + precision);
  std::string settings = tiny_settings(prepared_corpus()) + " --set train.device=cuda --set model.dropout=0.1"
                         " --set precision.dtype=" + precision;
  auto r = run_tessera("train --config tiny_gpt" + settings + " --set train.steps=20 --set checkpoint.every=10 --out " + out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(precision + " on cuda"), std::string::npos) << r.output;
  const auto full = losses(out);
  ASSERT_EQ(full.size(), 20u);
  for (const auto& [step, loss] : full) EXPECT_TRUE(std::isfinite(loss)) << "step " << step;
  EXPECT_LT(full.rbegin()->second, full.begin()->second - 0.5) << "the loss did not fall";

  const std::string resumed_dir = out + "_resumed";
  auto resumed = run_tessera("train --resume " + out + "/checkpoints/step_10 --out " + resumed_dir);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_EQ(resumed.output.find("re-seeded"), std::string::npos) << resumed.output;
  const auto continued = losses(resumed_dir);
  ASSERT_EQ(continued.size(), 10u);
  for (const auto& [step, loss] : continued)
    EXPECT_NEAR(loss, full.at(step), 1e-3 * std::abs(full.at(step))) << "step " << step;
}

INSTANTIATE_TEST_SUITE_P(Precision, GpuTrain, ::testing::Values("fp32", "bf16", "fp16"));

}  // namespace
}  // namespace tessera::test
