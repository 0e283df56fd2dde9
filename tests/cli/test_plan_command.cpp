// `tessera plan`: the JSON contract (best first, each layout's set keys, step, tokens/s, MFU,
// memory, fits and breakdown), held keys held, and a bad cluster file refused by file and key.
#include <gtest/gtest.h>

#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "cli_util.h"

namespace tessera::test {
namespace {

TEST(PlanCommand, PrintsTheLayoutsBestFirstAsJsonWithHeldKeysHeld) {
  auto r = run_tessera("plan --config tiny_gpt --cluster dgx_a100_80g --world 4 --set parallel.tp=2 --top 4 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json out = nlohmann::json::parse(r.output);
  const auto& layouts = out.at("layouts");
  ASSERT_EQ(layouts.size(), 4u) << r.output;
  for (size_t i = 0; i < layouts.size(); ++i) {
    const auto& l = layouts[i];
    for (const char* key : {"set", "step_s", "tokens_per_s", "mfu", "peak_memory_gib", "fits", "breakdown"})
      EXPECT_TRUE(l.contains(key)) << key;
    EXPECT_EQ(l["set"]["parallel.tp"], "2");
    EXPECT_GT(l["mfu"].get<double>(), 0);
    EXPECT_LT(l["mfu"].get<double>(), 1);
    double parts = 0;
    for (const auto& [name, seconds] : l["breakdown"].items()) parts += seconds.get<double>();
    EXPECT_NEAR(parts, l["step_s"].get<double>(), 1e-9 * l["step_s"].get<double>());
    if (i > 0 && l["fits"] == layouts[i - 1]["fits"]) {
      EXPECT_LE(layouts[i - 1]["step_s"].get<double>(), l["step_s"].get<double>());
    }
  }

  // The table: a ready --set line for the best layout.
  auto text = run_tessera("plan --config tiny_gpt --cluster dgx_a100_80g --world 4 --set parallel.tp=2");
  ASSERT_EQ(text.exit_code, 0) << text.output;
  EXPECT_NE(text.output.find("run it with: --set parallel.tp=2"), std::string::npos) << text.output;

  // Under memory.activation_policy = auto the best layout's policy, each block's choice, follows;
  // in JSON each layout carries its ranks' choices, every block's codec one of those allowed.
  const std::string auto_policy = "plan --config tiny_gpt --cluster this_machine_2core --world 1 --set "
                                  "train.batch_size=16 --set memory.activation_policy=auto --set "
                                  "memory.device_budget_gb=0.06 --set memory.activation_compression=bf16,int8";
  auto policy = run_tessera(auto_policy);
  ASSERT_EQ(policy.exit_code, 0) << policy.output;
  EXPECT_NE(policy.output.find("activation policy (memory.activation_policy = auto)"), std::string::npos)
      << policy.output;
  EXPECT_NE(policy.output.find("activation_policy"), std::string::npos) << policy.output;
  auto policy_json = run_tessera(auto_policy + " --json");
  ASSERT_EQ(policy_json.exit_code, 0) << policy_json.output;
  const nlohmann::json chosen = nlohmann::json::parse(policy_json.output)["layouts"][0]["activation_policy"];
  ASSERT_EQ(chosen.size(), 1u) << chosen;
  ASSERT_EQ(chosen[0]["blocks"].size(), 4u) << chosen;
  EXPECT_LE(chosen[0]["bytes"].get<double>(), chosen[0]["budget_bytes"].get<double>());
  std::set<std::string> codecs;
  for (const auto& block : chosen[0]["blocks"]) codecs.insert(block["compression"].get<std::string>());
  for (const std::string& codec : codecs) EXPECT_TRUE(codec == "none" || codec == "bf16" || codec == "int8") << codec;
  EXPECT_TRUE(codecs.count("bf16") + codecs.count("int8") > 0) << chosen;  // 0.06 GiB does not keep them all
}

// A dropless MoE under ep: the table says at what load its experts were priced, and a heavier load
// predicts a slower step; a load under 1 is refused naming the flag.
TEST(PlanCommand, DroplessExpertsAreShownAtTheirExpertLoad) {
  const std::string plan = "plan --config tiny_mixtral --cluster this_machine_2core --world 2 --top 1 --set parallel.ep=2 "
                           "--set parallel.tp=1 --set parallel.pp=1 --set model.moe_capacity_factor=0";
  auto text = run_tessera(plan + " --expert-load 1.25");
  ASSERT_EQ(text.exit_code, 0) << text.output;
  EXPECT_NE(text.output.find("dropless routing over ep = 2: the busiest rank's experts priced at 1.25 x"),
            std::string::npos)
      << text.output;
  auto step = [&](const std::string& load) {
    auto r = run_tessera(plan + " --json --expert-load " + load);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return nlohmann::json::parse(r.output)["layouts"][0]["step_s"].get<double>();
  };
  EXPECT_GT(step("1.5"), step("1"));
  auto refused = run_tessera(plan + " --expert-load 0.5");
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_NE(refused.output.find("--expert-load"), std::string::npos) << refused.output;
}

TEST(PlanCommand, ABadClusterFileIsRefusedNamingFileAndKey) {
  const std::string dir = fresh_dir("plan_bad_cluster");
  std::string cluster = slurp(source_path("clusters/dgx_a100_80g.toml"));
  cluster.replace(cluster.find("memory_gbs"), 10, "memory_gps");
  std::ofstream(dir + "/bad.toml") << cluster;
  expect_error("plan --config gpt2_124m --cluster " + dir + "/bad.toml --world 8",
               {dir + "/bad.toml", "unknown key 'device.memory_gps'", "did you mean 'device.memory_gbs'"});
  expect_error("plan --config gpt2_124m --cluster no_such_cluster", {"no_such_cluster", "presets: ", "dgx_a100_80g"});
  expect_error("plan --config gpt2_124m --cluster dgx_a100_80g --set memory.activation_compression=int8",
               {"dgx_a100_80g.toml", "device.activation_codec_int8_gbs", "tessera plan calibrate"});
  std::string no_host = slurp(source_path("clusters/dgx_a100_80g.toml"));
  no_host.erase(no_host.find("optimizer_gbs"));
  std::ofstream(dir + "/no_host.toml") << no_host;
  expect_error("plan --config gpt2_124m --cluster " + dir + "/no_host.toml --world 8 --set parallel.offload=true "
               "--set parallel.zero_stage=1",
               {dir + "/no_host.toml", "host.optimizer_gbs"});
}

// `tessera plan calibrate` writes this machine as a cluster file that loads and plans (short
// measurements: the numbers' accuracy is bench/plan_runs_here.py's, not a timed test's).
TEST(PlanCommand, CalibratesThisMachineIntoAClusterFileItPlansWith) {
  const std::string dir = fresh_dir("plan_calibrate");
  auto r = run_tessera("plan calibrate --out " + dir + "/here.toml --seconds 0.02");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string file = slurp(dir + "/here.toml");
  for (const char* key : {"matmul_tflops_fp32 = ", "attention_tflops_fp32 = ", "memory_gbs = ", "shared_slowdown = ",
                          "[intra_node]", "optimizer_gbs = ", "[peers]", "cpu_ns_per_byte = ",
                          "measured by `tessera plan calibrate`"})
    EXPECT_NE(file.find(key), std::string::npos) << key << "\n" << file;
  auto plan = run_tessera("plan --config tiny_gpt --cluster " + dir + "/here.toml --world 2 --top 1 --json");
  ASSERT_EQ(plan.exit_code, 0) << plan.output;
  EXPECT_GT(nlohmann::json::parse(plan.output)["layouts"][0]["step_s"].get<double>(), 0);
}

// train.plan_cluster: a run prints the planner's prediction for its layout at start and its measured
// step beside it after step 5, and records both; a cluster that cannot be read is refused by key.
TEST(PlanCommand, ATrainingRunChecksThePlannersPredictionForItsLayout) {
  const std::string out = fresh_dir("plan_checked_run");
  auto r = run_tessera("train --config tiny_gpt" + tiny_settings(prepared_corpus()) +
                       " --set train.steps=6 --set eval.every=0 --set train.plan_cluster=this_machine_2core --out " + out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("plan: on "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("plan: step 5 measured "), std::string::npos) << r.output;
  int recorded = 0;
  for (const auto& line : metrics_lines(out))
    if (line.contains("plan")) {
      EXPECT_GT(line["plan"]["predicted_step_s"].get<double>(), 0);
      EXPECT_GT(line["plan"]["measured_step_s"].get<double>(), 0);
      ++recorded;
    }
  EXPECT_EQ(recorded, 1);
  expect_error("train --config tiny_gpt" + tiny_settings(prepared_corpus()) +
                   " --set train.steps=2 --set train.plan_cluster=no_such_cluster --out " + fresh_dir("plan_bad"),
               {"train.plan_cluster", "no_such_cluster"});
}

}  // namespace
}  // namespace tessera::test
