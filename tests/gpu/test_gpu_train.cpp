// Training on a CUDA device in bf16 and fp16 through the CLI. Skipped without CUDA (and in builds
// with TESSERA_CUDA=OFF, where libtorch_cuda is not linked).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "../cli/cli_util.h"

namespace tessera::test {
namespace {

class GpuTrain : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_P(GpuTrain, TrainsAndResumes) {
  std::string out = fresh_dir(std::string("gpu_") + GetParam());
  std::string settings = tiny_settings(prepared_corpus()) + " --set train.device=cuda --set precision.dtype=" + GetParam();
  auto r = run_tessera("train --config tiny_gpt" + settings + " --set train.steps=20 --set checkpoint.every=10 --out " + out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto resumed = run_tessera("train --resume " + out + "/checkpoints/step_10 --out " + out + "_resumed");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
}

INSTANTIATE_TEST_SUITE_P(Precision, GpuTrain, ::testing::Values("fp32", "bf16", "fp16"));

}  // namespace
}  // namespace tessera::test
