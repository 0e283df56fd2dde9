// Pipeline stage cuts: every block in exactly one stage, uneven counts said so, the parameter cut
// balancing the embedding and the tied head against blocks, and more stages than blocks refused.
#include <gtest/gtest.h>

#include "parallel/pipeline/schedule_builders.h"
#include "plan/stage_cut.h"
#include "test_util.h"
#include "config/config.h"

namespace tessera {
namespace {

ModelOptions gpt2() { return Config::load(test::source_path("configs/gpt2_124m.toml"), {}).model; }

TEST(StageCut, LayersCutCoversEveryBlockOnceAndSaysWhenUneven) {
  ModelOptions m = gpt2();
  const StageCut even = cut_stages(m, 4, "layers");
  EXPECT_EQ(even.boundaries, (std::vector<int64_t>{0, 3, 6, 9, 12}));
  EXPECT_TRUE(even.even());
  // GPT-2 small: h = 768, a block 12h^2 + 13h = 7,087,872; wte 50304 x 768, wpe 1024 x 768.
  const int64_t block = 7087872, wte = 50304 * 768, wpe = 1024 * 768, ln_f = 2 * 768;
  EXPECT_EQ(even.parameters, (std::vector<int64_t>{wte + wpe + 3 * block, 3 * block, 3 * block, 3 * block + ln_f + wte}));
  m.n_layer = 10;  // 10 blocks on 4 stages: 3, 3, 2, 2 (torchtitan and Megatron once dropped the remainder)
  const StageCut uneven = cut_stages(m, 4, "layers");
  EXPECT_EQ(uneven.boundaries, (std::vector<int64_t>{0, 3, 6, 8, 10}));
  EXPECT_FALSE(uneven.even());
  EXPECT_NE(describe_stage_cut(uneven).find("do not divide evenly into 4 stages"), std::string::npos);
  EXPECT_NE(describe_stage_cut(uneven).find("stage 3: blocks 8-9 + head"), std::string::npos) << describe_stage_cut(uneven);
}

// The profile cut balances measured time: a head (with the loss) as costly as four blocks leaves
// the last stage one block; the stages' predicted times and activation bytes are the sums.
TEST(StageCut, ProfileCutBalancesMeasuredTime) {
  ModelOptions m = gpt2();
  BlockCosts costs;
  costs.block_seconds.assign(12, 0.010);
  costs.block_activation_bytes.assign(12, 1 << 20);
  costs.embedding_seconds = 0.001;
  costs.head_seconds = 0.040;
  const StageCut cut = cut_by_time(m, 4, costs);
  EXPECT_EQ(cut.method, "profile");
  // At most 50 ms a stage (the last: one block and the head); of those cuts the most even: 31, 40,
  // 40 and 50 ms.
  EXPECT_EQ(cut.boundaries, (std::vector<int64_t>{0, 3, 7, 11, 12}));
  ASSERT_EQ(cut.seconds.size(), 4u);
  EXPECT_NEAR(cut.seconds[0], 0.031, 1e-12);
  EXPECT_NEAR(cut.seconds[3], 0.050, 1e-12);
  EXPECT_DOUBLE_EQ(cut.activation_bytes[1], 4.0 * (1 << 20));
  const std::string text = describe_stage_cut(cut);
  EXPECT_NE(text.find("measured forward + backward 50.00 ms, activations 1.00 MiB"), std::string::npos) << text;
  EXPECT_NE(text.find("balanced by measured time"), std::string::npos) << text;
  EXPECT_NE(text.find("slowest stage 50.00 ms"), std::string::npos) << text;
}

// Any cut takes the profile's split costs: each stage's F, B, I, W are its blocks' and ends' sums, the
// start-up print shows them and the step they predict (nothing predicted under tp, whose stages
// split the whole blocks the profile timed).
TEST(StageCut, AnyCutPredictsItsStepFromTheMeasuredSplit) {
  ModelOptions m = gpt2();
  BlockCosts costs;
  costs.block_seconds.assign(12, 0.006);
  costs.block_activation_bytes.assign(12, 1 << 20);
  costs.block_split.assign(12, {0.002, 0.0038, 0.0025, 0.0015});  // B timed apart, less than I + W
  costs.embedding_split = {0.001, 0.001, 0, 0.001};
  costs.head_split = {0.004, 0.008, 0.004, 0.004};
  costs.embedding_seconds = 0.002, costs.head_seconds = 0.012;
  StageCut cut = cut_stages(m, 2, "layers");
  add_measured_costs(cut, costs);
  ASSERT_EQ(cut.compute.size(), 2u);
  EXPECT_NEAR(cut.compute[0].f, 6 * 0.002 + 0.001, 1e-12);
  EXPECT_NEAR(cut.compute[1].i, 6 * 0.0025 + 0.004, 1e-12);
  EXPECT_NEAR(cut.compute[1].b, 6 * 0.0038 + 0.008, 1e-12);
  EXPECT_NEAR(cut.seconds[1], 6 * 0.006 + 0.012, 1e-12);
  const std::string stages = describe_stage_cut(cut);
  EXPECT_NE(stages.find("parameters; measured F 16.00 ms, B 30.80 ms, I 19.00 ms, W 13.00 ms"), std::string::npos) << stages;
  Config config = Config::load(test::source_path("configs/gpt2_124m.toml"), {});
  config.parallel.pp = 2;
  config.train.grad_accum = 4;
  const ParallelDims dims(config.parallel, 2, "t");
  const pipeline::Schedule schedule = pipeline::schedule_for_options(config.parallel, 2, 4);
  const std::optional<pipeline::Simulation> predicted = predicted_step(dims, cut, schedule);
  ASSERT_TRUE(predicted.has_value());
  pipeline::ActionCosts by_stage;
  by_stage.stages = cut.compute;
  EXPECT_DOUBLE_EQ(predicted->step_time, pipeline::simulate_schedule(schedule, by_stage).step_time);
  char line[120];
  std::snprintf(line, sizeof line, "predicted step %.1f ms, bubble %.1f%%", 1000 * predicted->step_time,
                100 * predicted->bubble());
  const std::string text = describe_pipeline_layout(config, dims, cut, schedule);
  EXPECT_NE(text.find(line), std::string::npos) << text;
  config.parallel.tp = 2;
  const ParallelDims with_tp(config.parallel, 4, "t");
  EXPECT_FALSE(predicted_step(with_tp, cut, schedule).has_value());
  EXPECT_NE(describe_pipeline_layout(config, with_tp, cut, schedule).find("no step is predicted under tensor"),
            std::string::npos);
}

TEST(StageCut, ParamsCutBalancesTheEmbeddingAndHeadAgainstBlocks) {
  const StageCut cut = cut_stages(gpt2(), 4, "params");
  ASSERT_EQ(cut.boundaries.size(), 5u);
  EXPECT_EQ(cut.boundaries.front(), 0);
  EXPECT_EQ(cut.boundaries.back(), 12);
  // The embedding (and the head's copy of it) weigh about 5.5 blocks: the end stages get one block.
  // Among the cuts with that largest stage, the most even: 1, 5, 5, 1 (not 1, 4, 6, 1).
  EXPECT_EQ(cut.boundaries, (std::vector<int64_t>{0, 1, 6, 11, 12}));
  const int64_t largest = *std::max_element(cut.parameters.begin(), cut.parameters.end());
  EXPECT_EQ(largest, 50304 * 768 + 1024 * 768 + 7087872);  // the first stage: embeddings + one block
  const StageCut layers = cut_stages(gpt2(), 4, "layers");
  EXPECT_LT(largest, *std::max_element(layers.parameters.begin(), layers.parameters.end()));
}

// parallel.pp_layers: the cut by hand, one block count per stage (pp x stages per rank).
TEST(StageCut, HandCutIsTakenAsGivenAndMustCoverTheBlocks) {
  Config c = Config::load(test::source_path("configs/gpt2_124m.toml"), {});
  c.parallel.pp = 4;
  c.parallel.pp_layers = {2, 4, 4, 2};
  const ParallelDims dims(c.parallel, 4, "test");
  const StageCut cut = pipeline_cut(c, dims);
  EXPECT_EQ(cut.method, "hand");
  EXPECT_EQ(cut.boundaries, (std::vector<int64_t>{0, 2, 6, 10, 12}));
  EXPECT_NE(describe_stage_cut(cut).find("parallel.pp_layers, by hand"), std::string::npos) << describe_stage_cut(cut);
  c.parallel.pp_layers = {2, 4, 4};
  EXPECT_TRUE(test::throws_naming([&] { pipeline_cut(c, dims); },
                                  {"parallel.pp_layers has 3 entries for 4 pipeline stages"}));
  c.parallel.pp_layers = {2, 4, 4, 1};
  EXPECT_TRUE(test::throws_naming([&] { pipeline_cut(c, dims); },
                                  {"parallel.pp_layers = [2, 4, 4, 1] holds 11 blocks", "model.n_layer = 12"}));
  c.parallel.pp_layers = {6, 0, 4, 2};
  EXPECT_TRUE(test::throws_naming([&] { pipeline_cut(c, dims); }, {"stage 1 has 0 blocks"}));
  c.parallel.pp_schedule = "interleaved";  // 8 stages: 8 entries
  c.train.grad_accum = 4;
  c.parallel.pp_layers = {1, 2, 2, 1, 1, 2, 2, 1};
  EXPECT_EQ(pipeline_cut(c, dims).stages(), 8);
}

TEST(StageCut, MoreStagesThanBlocksAreRefused) {
  EXPECT_TRUE(test::throws_naming([] { cut_stages(gpt2(), 16, "layers"); },
                                  {"16 pipeline stages", "model.n_layer = 12", "parallel.pp"}));
}

}  // namespace
}  // namespace tessera
