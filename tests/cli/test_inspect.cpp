// `tessera inspect`: parameter counts from the model's own modules (meta device) and the
// per-rank memory of the configured layout, checked against numbers known independently.
#include <gtest/gtest.h>

#include <regex>

#include "cli_util.h"

namespace tessera::test {
namespace {

// The value of a "  <label>  <number> <unit>" line, in bytes.
double bytes_of(const std::string& output, const std::string& label) {
  std::smatch m;
  if (!std::regex_search(output, m, std::regex(label + " +([0-9.]+) (B|KiB|MiB|GiB|TiB)"))) return -1;
  const std::string unit = m[2];
  double scale = 1;
  for (const char* u : {"KiB", "MiB", "GiB", "TiB"}) {
    scale *= 1024;
    if (unit == u) return std::stod(m[1]) * scale;
  }
  return std::stod(m[1]);
}

TEST(Inspect, CountsGpt2AndGpt3FromTheirModules) {
  // GPT-2 small as released (Hugging Face gpt2): 124,439,808 parameters; with the vocabulary padded
  // from 50257 to 50304 rows (model.vocab_multiple = 128) 124,475,904, and without padding HF's.
  auto gpt2 = run_tessera("inspect --config gpt2_124m");
  ASSERT_EQ(gpt2.exit_code, 0) << gpt2.output;
  EXPECT_NE(gpt2.output.find("(124475904)"), std::string::npos) << gpt2.output;
  auto unpadded = run_tessera("inspect --config gpt2_124m --set model.vocab_multiple=1");
  EXPECT_NE(unpadded.output.find("(124439808)"), std::string::npos) << unpadded.output;
  // GPT-3 175B (Brown et al.): within 0.5% of 175B, without allocating it.
  auto gpt3 = run_tessera("inspect --config gpt3_175b --world 1024");
  ASSERT_EQ(gpt3.exit_code, 0) << gpt3.output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(gpt3.output, m, std::regex("\\(([0-9]+)\\)"))) << gpt3.output;
  EXPECT_NEAR(std::stod(m[1]), 175e9, 0.005 * 175e9) << gpt3.output;
  EXPECT_NE(gpt3.output.find("dp=128 tp=8"), std::string::npos) << gpt3.output;
}

// ZeRO's bytes per parameter (Rajbhandari et al.): fp32 AdamW holds 4 + 4 + 8 bytes per
// parameter; stage 1 divides the 8 by N, stage 2 also the gradient's 4, stage 3 everything.
TEST(Inspect, ZeroStagesDivideWhatTheyShard) {
  const double P = 124475904;  // vocabulary padded to 50304
  const double N = 4;
  const double expected[4][3] = {{4 * P, 4 * P, 8 * P},
                                 {4 * P, 4 * P, 8 * P / N},
                                 {4 * P, 4 * P / N, 8 * P / N},
                                 {4 * P / N, 4 * P / N, 8 * P / N}};
  for (int stage = 0; stage <= 3; ++stage) {
    auto r = run_tessera("inspect --config gpt2_124m --world 4 --set parallel.zero_stage=" + std::to_string(stage));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const char* labels[] = {"parameters", "gradients", "optimizer state"};
    for (int i = 0; i < 3; ++i)  // printed with 3 significant decimals of the unit
      EXPECT_NEAR(bytes_of(r.output, labels[i]), expected[stage][i], 0.001 * expected[stage][i])
          << "stage " << stage << " " << labels[i] << "\n" << r.output;
  }
  // Under tp = 2 a rank holds half of every split matrix and all of the norms and wpe.
  // (The padded vocabulary of 50304 rows splits at tp = 2 without further keys.)
  auto tp = run_tessera("inspect --config gpt2_124m --world 2 --set parallel.tp=2");
  ASSERT_EQ(tp.exit_code, 0) << tp.output;
  EXPECT_NE(tp.output.find("dp=1 tp=2"), std::string::npos) << tp.output;
  // Replicated: wpe 1024 x 768, 25 LayerNorms' 2 x 768, 24 row-parallel biases of 768; the rest of
  // the 124,475,904 (vocabulary padded to 50304) is split in two.
  const double replicated = 1024 * 768 + 25 * 2 * 768 + 24 * 768;
  const double held = (124475904 - replicated) / 2 + replicated;
  EXPECT_NEAR(bytes_of(tp.output, "parameters"), 4 * held, 0.001 * 4 * held) << tp.output;
  // Refused layouts are refused as `tessera train` would refuse them.
  auto refused = run_tessera("inspect --config gpt2_124m --world 2 --set parallel.tp=2 --set model.vocab_multiple=1");
  EXPECT_EQ(refused.exit_code, 2);
  EXPECT_NE(refused.output.find("model.vocab_size = 50257 padded to a multiple of model.vocab_multiple = 1 is 50257, "
                                "not a multiple of parallel.tp = 2"),
            std::string::npos)
      << refused.output;
}

// A pipeline layout is planned (training it is not built yet): the cut, the schedule's simulated
// bubble, and the memory of the pipeline rank that needs the most, whose parameters are its
// stage's. GPT-2 small on 4 stages in fp32 at micro-batches of 8 x 1024 tokens: rank 0 holds the
// embeddings, blocks 0-2 and four micro-batches' activations, rank 3 blocks 9-11, the head and one
// micro-batch's, but also the head's backward working set (the log-probabilities of 8192 tokens x
// 50304 and the gradients of them and of the logits, three float32 tensors of 1.54 GiB; the step
// drops the logits before its backward), which makes it the largest; with a vocabulary of 512
// rank 0 is.
TEST(Inspect, PipelineLayoutsShowTheCutScheduleAndLargestRank) {
  auto r = run_tessera("inspect --config gpt2_124m --world 4 --set parallel.pp=4 --set train.grad_accum=8");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("pipeline: 1f1b, 4 ranks x 1 stage(s), cut by layers"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("stage 3: blocks 9-11 + head"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("8 micro-batches per step: simulated bubble 27.3%"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("the largest: pipeline rank 3"), std::string::npos) << r.output;
  const double stage3 = 50304.0 * 768 + 3 * 7087872.0 + 2 * 768;
  EXPECT_NEAR(bytes_of(r.output, "parameters"), 4 * stage3, 0.001 * 4 * stage3) << r.output;
  const double working = 8192.0 * (2 * 768 + 3 * 50304) * 4 + 50304.0 * 768 * 4;
  EXPECT_NEAR(bytes_of(r.output, "backward working"), working, 0.001 * working) << r.output;
  auto small = run_tessera("inspect --config gpt2_124m --world 4 --set parallel.pp=4 --set train.grad_accum=8 "
                           "--set model.vocab_size=512");
  ASSERT_EQ(small.exit_code, 0) << small.output;
  EXPECT_NE(small.output.find("the largest: pipeline rank 0"), std::string::npos) << small.output;
  EXPECT_NE(small.output.find("up to 4 micro-batches"), std::string::npos) << small.output;
  const double stage0 = 512.0 * 768 + 1024 * 768 + 3 * 7087872.0;
  EXPECT_NEAR(bytes_of(small.output, "parameters"), 4 * stage0, 0.001 * 4 * stage0) << small.output;
  expect_error("inspect --config gpt2_124m --world 4 --set parallel.pp=4 --set parallel.pp_schedule=interleaved "
               "--set train.grad_accum=6",
               {"multiple of parallel.pp = 4"});
  expect_error("inspect --config gpt2_124m --world 16 --set parallel.pp=16", {"16 pipeline stages", "model.n_layer = 12"});
  // The profile cut is measured by the workers; before that the plan shows the parameter cut, saying so.
  auto profiled = run_tessera("inspect --config gpt2_124m --world 4 --set parallel.pp=4 --set parallel.pp_cut=profile");
  ASSERT_EQ(profiled.exit_code, 0) << profiled.output;
  EXPECT_NE(profiled.output.find("cut by params until profiled"), std::string::npos) << profiled.output;
  EXPECT_NE(profiled.output.find("the workers measure every block at start"), std::string::npos) << profiled.output;
  expect_error("inspect --config gpt2_124m --world 4 --set parallel.pp=4 --set parallel.pp_cut=time",
               {"parallel.pp_cut must be layers, params or profile"});
  expect_error("inspect --config gpt2_124m --world 4 --set parallel.pp=4 --set parallel.pp_transfer_dtype=fp8",
               {"parallel.pp_transfer_dtype must be compute or float32 (got \"fp8\")"});
  expect_error("inspect --config gpt2_124m --world 4 --set parallel.pp=4 --set parallel.pp_schedule_costs=auto",
               {"parallel.pp_schedule_costs must be measured or unit (got \"auto\")"});
}

}  // namespace
}  // namespace tessera::test
