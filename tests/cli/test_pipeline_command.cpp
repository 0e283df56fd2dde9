// `tessera pipeline`: the table, the simulated bubble beside its formula, the peak per rank and
// the timeline picture, without a model; a broken CSV table is refused naming rank and action.
#include <gtest/gtest.h>

#include "cli_util.h"

namespace tessera::test {
namespace {

TEST(PipelineCommand, PrintsTheTableBubbleAndPeakAndDrawsTheTimeline) {
  const std::string dir = fresh_dir("pipeline_command");
  auto r = run_tessera("pipeline --schedule zbh1 --pp 4 --microbatches 8 --svg " + dir + "/zbh1.svg --csv " + dir +
                       "/zbh1.csv");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("rank 3  | 3F0 3I0 3F1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("step time 27; bubble 11.11% of 4 ranks x step time (formula 11.11%)"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("per rank: 4 4 4 4"), std::string::npos) << r.output;
  const std::string svg = slurp(dir + "/zbh1.svg");
  EXPECT_NE(svg.find("<svg"), std::string::npos);
  EXPECT_NE(svg.find(">3I7<"), std::string::npos);

  // The written table runs again as file:PATH; with one receive removed it is refused.
  auto again = run_tessera("pipeline --schedule file:" + dir + "/zbh1.csv --pp 4 --microbatches 8");
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_NE(again.output.find("bubble 11.11%"), std::string::npos) << again.output;
  std::string table = slurp(dir + "/zbh1.csv");
  table.replace(table.find("1RECV_F1,"), 9, "");
  std::ofstream(dir + "/broken.csv") << table;
  expect_error("pipeline --schedule file:" + dir + "/broken.csv --pp 4 --microbatches 8",
               {"rank 1, action 1F1", "no 1RECV_F1 precedes it", "[1F1]"});
  expect_error("pipeline --schedule interleaved --pp 4 --microbatches 6", {"multiple of parallel.pp = 4"});

  // ZeRO-3's gathers as table actions: per action one stage whole at a time, per step both of an
  // interleaved rank's.
  auto gathers = run_tessera("pipeline --schedule interleaved --pp 2 --microbatches 4 --zero3 action --costs gather=0.5");
  ASSERT_EQ(gathers.exit_code, 0) << gathers.output;
  EXPECT_NE(gathers.output.find("rank 0  |  0GATHER      0F0 0RELEASE  0GATHER      0F1"), std::string::npos)
      << gathers.output;
  EXPECT_NE(gathers.output.find("OPTIM"), std::string::npos) << gathers.output;
  EXPECT_NE(gathers.output.find("gathered whole (ZeRO-3 per action), per rank: 1 1"), std::string::npos) << gathers.output;
  auto once = run_tessera("pipeline --schedule interleaved --pp 2 --microbatches 4 --zero3 step");
  EXPECT_NE(once.output.find("per rank: 2 2"), std::string::npos) << once.output;

  // --measure runs the table on pp processes and draws the measured timeline too.
  auto measured = run_tessera("pipeline --schedule 1f1b --pp 2 --microbatches 4 --measure 5 --svg " + dir + "/m.svg");
  ASSERT_EQ(measured.exit_code, 0) << measured.output;
  EXPECT_NE(measured.output.find("measured on 2 processes (actions sleep cost x 5 ms)"), std::string::npos)
      << measured.output;
  EXPECT_NE(slurp(dir + "/m.measured.svg").find("measured (sleeps of 5 ms per unit)"), std::string::npos);
}

// --model prices the table with a model's profiled blocks: each stage's measured F, B, I, W and the
// step they predict, with the model's cut; not with a file: table. ZB-H1's table is built for those
// costs: where this machine's B is cheaper than I + W some backwards are whole, so rank 1's first
// backward is 1I0 or 1B0.
TEST(PipelineCommand, ModelProfilesItsBlocksAndPredictsTheStep) {
  auto r = run_tessera("pipeline --model tiny_gpt --pp 2 --schedule zbh1 --microbatches 4 --set train.batch_size=2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("pipeline: zbh1, 2 ranks x 1 stage(s), cut by layers"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("stage 1: blocks 2-3 + head"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("measured F "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("with each stage's measured F, I, W: predicted step"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("costs: each stage's measured F, B, I, W (seconds, above)"), std::string::npos) << r.output;
  EXPECT_TRUE(r.output.find("rank 1  | 1F0 1I0 1F1") != std::string::npos ||
              r.output.find("rank 1  | 1F0 1B0 1F1") != std::string::npos)
      << r.output;
  expect_error("pipeline --model tiny_gpt --pp 2 --schedule zbh1 --zero3 step", {"--model prices a built-in"});
}

}  // namespace
}  // namespace tessera::test
