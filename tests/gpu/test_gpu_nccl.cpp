// `tessera train --nproc 2` on CUDA over NCCL (one GPU per local rank) against one process on one
// GPU with the same global batch, for each path of comm::Group: all_reduce (DDP), all_gather and
// reduce_scatter (ZeRO-3, Megatron-SP), the paired send/recv of ring attention, all_to_all
// (Ulysses) and the one-way send/recv of LASP. Also: train.device = cuda:0 given to both local
// ranks is refused before training. Needs 2 CUDA devices; skipped (not failed) with fewer.
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <cmath>
#include <map>

#include "../cli/cli_util.h"

namespace tessera::test {
namespace {

class GpuNccl : public ::testing::Test {
 protected:
  void SetUp() override {
    const int gpus = static_cast<int>(torch::cuda::device_count());
    if (gpus < 2)
      GTEST_SKIP() << "needs 2 CUDA devices (tessera train --nproc 2 puts local rank L on cuda:L, NCCL between "
                      "them); this machine has "
                   << gpus;
  }
};

std::string settings(const std::string& config, int64_t batch_size) {
  return "train --config " + config + tiny_settings(prepared_corpus()) +
         " --set train.device=cuda --set model.dropout=0 --set train.steps=6 --set eval.every=0"
         " --set model.linear_chunk=4 --set train.batch_size=" +
         std::to_string(batch_size);
}

std::map<int64_t, double> losses(const std::string& run_dir) {
  std::map<int64_t, double> out;
  for (const auto& line : metrics_lines(run_dir))
    if (line.contains("loss")) out[line["step"]] = line["loss"];
  return out;
}

struct Layout {
  const char* name;
  const char* config;
  const char* parallel;  // --set options of the 2-rank run
  int64_t batch_size;    // per rank: 4 under dp = 2, the whole batch of 8 otherwise
};

TEST_F(GpuNccl, TwoRanksMatchOneProcess) {
  const Layout layouts[] = {
      {"dp2", "tiny_gpt", "", 4},
      {"dp2_zero3", "tiny_gpt", " --set parallel.zero_stage=3", 4},
      {"tp2_megatron_sp", "tiny_gpt", " --set parallel.tp=2 --set parallel.megatron_sp=true", 8},
      {"sp2_ring", "tiny_gpt", " --set parallel.sp=2 --set parallel.sp_method=ring", 8},
      {"sp2_ulysses", "tiny_gpt", " --set parallel.sp=2 --set parallel.sp_method=ulysses", 8},
      {"sp2_lasp", "tiny_linear", " --set parallel.sp=2 --set parallel.sp_method=lasp", 8},
  };
  std::map<std::string, std::map<int64_t, double>> single;
  for (const char* config : {"tiny_gpt", "tiny_linear"}) {
    const std::string out = fresh_dir(std::string("nccl_one_") + config);
    auto r = run_tessera(settings(config, 8) + " --out " + out);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    single[config] = losses(out);
  }
  for (const Layout& layout : layouts) {
    const std::string out = fresh_dir(std::string("nccl_") + layout.name);
    auto r = run_tessera(settings(layout.config, layout.batch_size) + " --nproc 2" + layout.parallel + " --out " + out);
    ASSERT_EQ(r.exit_code, 0) << layout.name << "\n" << r.output;
    const auto actual = losses(out), &expected = single[layout.config];
    ASSERT_EQ(actual.size(), expected.size()) << layout.name;
    for (const auto& [step, loss] : actual)  // fp32; the reduction order differs from one GPU's
      EXPECT_NEAR(loss, expected.at(step), 1e-4 * std::abs(expected.at(step))) << layout.name << " step " << step;
  }
}

TEST_F(GpuNccl, OneExplicitGpuForBothLocalRanksIsRefused) {
  const std::string out = fresh_dir("nccl_shared_gpu");
  auto r = run_tessera(settings("tiny_gpt", 4) + " --set train.device=cuda:0 --nproc 2 --out " + out);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("train.device = \"cuda:0\" is given to all 2 processes of this node"), std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace tessera::test
