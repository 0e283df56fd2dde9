// Run directories (train/run_dir.h): a directory holding a run is refused unless the run continues
// it or --overwrite is given, --resume without --out continues the checkpoint's own run in place,
// and a directory locked by a live run is refused naming the holder's pid. Each refusal leaves
// the old run's files exactly as they were.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <set>

#include "cli_util.h"
#include "train/run_dir.h"

namespace tessera::test {
namespace {

namespace fs = std::filesystem;

std::string short_run(int64_t steps) {
  return "train --config tiny_gpt" + tiny_settings(prepared_corpus()) + " --set train.steps=" + std::to_string(steps) +
         " --set checkpoint.every=2 --set checkpoint.keep=0 --set eval.every=0";
}

// The training lines of RUN/metrics.jsonl (evaluation lines, one at the end of each run, left out).
std::vector<nlohmann::json> train_lines(const std::string& run) {
  std::vector<nlohmann::json> out;
  for (const auto& line : metrics_lines(run))
    if (line.contains("loss")) out.push_back(line);
  return out;
}

std::set<std::string> checkpoints(const std::string& run) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(run + "/checkpoints"))
    if (e.is_directory()) out.insert(e.path().filename().string());
  return out;
}

TEST(RunDirectory, UsedDirectoryIsRefusedUnlessOverwritten) {
  const std::string run = fresh_dir("run_dir_used");
  ASSERT_EQ(run_tessera(short_run(4) + " --out " + run).exit_code, 0);
  const std::string metrics = slurp(run + "/metrics.jsonl");
  ASSERT_EQ(checkpoints(run), (std::set<std::string>{"step_2", "step_4"}));

  const auto again = run_tessera(short_run(2) + " --out " + run);
  EXPECT_NE(again.exit_code, 0);
  for (const std::string& part : std::vector<std::string>{run + " already holds a run", "checkpoints/", "metrics.jsonl",
                                                         "--resume " + run, "--overwrite"})
    EXPECT_NE(again.output.find(part), std::string::npos) << part << "\n" << again.output;
  EXPECT_EQ(slurp(run + "/metrics.jsonl"), metrics);
  EXPECT_EQ(checkpoints(run), (std::set<std::string>{"step_2", "step_4"}));

  // A checkpoint of another run, resumed into this one, is refused as well.
  const std::string other = fresh_dir("run_dir_other");
  ASSERT_EQ(run_tessera(short_run(2) + " --out " + other).exit_code, 0);
  const auto foreign = run_tessera("train --resume " + other + "/checkpoints/step_2 --out " + run);
  EXPECT_NE(foreign.exit_code, 0);
  EXPECT_NE(foreign.output.find("already holds a run"), std::string::npos) << foreign.output;

  const auto over = run_tessera(short_run(2) + " --out " + run + " --overwrite");
  ASSERT_EQ(over.exit_code, 0) << over.output;
  EXPECT_EQ(checkpoints(run), (std::set<std::string>{"step_2"}));  // the old step_4 went with the old run
  EXPECT_EQ(train_lines(run).size(), 2u);
}

TEST(RunDirectory, ResumeWithoutOutContinuesTheRunInPlace) {
  const std::string run = fresh_dir("run_dir_in_place");
  ASSERT_EQ(run_tessera(short_run(4) + " --out " + run).exit_code, 0);
  const auto resumed = run_tessera("train --resume " + run + "/checkpoints/step_4 --set train.steps=6");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_EQ(checkpoints(run), (std::set<std::string>{"step_2", "step_4", "step_6"}));
  const auto lines = train_lines(run);
  ASSERT_EQ(lines.size(), 6u);
  for (size_t i = 0; i < lines.size(); ++i) EXPECT_EQ(lines[i]["step"], static_cast<int64_t>(i + 1));
  // A checkpoint outside any run directory has no run to continue: --out is required.
  const std::string loose = fresh_dir("run_dir_loose");
  fs::copy(run + "/checkpoints/step_6", loose + "/step_6", fs::copy_options::recursive);
  const auto no_run = run_tessera("train --resume " + loose + "/step_6");
  EXPECT_NE(no_run.exit_code, 0);
  EXPECT_NE(no_run.output.find("give --out"), std::string::npos) << no_run.output;
}

TEST(RunDirectory, LockedDirectoryIsRefusedNamingTheHolder) {
  const std::string run = fresh_dir("run_dir_locked");
  {
    RunLock held(run);  // this process stands for a run still training there
    for (const std::string& how :
         std::vector<std::string>{short_run(2) + " --out " + run, short_run(2) + " --nproc 2 --out " + run}) {
      const auto second = run_tessera(how);
      EXPECT_NE(second.exit_code, 0) << how;
      EXPECT_NE(second.output.find(run + " is in use by another run (pid " + std::to_string(::getpid()) + ")"),
                std::string::npos)
          << how << "\n" << second.output;
      EXPECT_FALSE(fs::exists(run + "/metrics.jsonl")) << how;
    }
  }
  // Released with its holder: the directory can be used.
  const auto after = run_tessera(short_run(2) + " --out " + run);
  EXPECT_EQ(after.exit_code, 0) << after.output;
}

}  // namespace
}  // namespace tessera::test
