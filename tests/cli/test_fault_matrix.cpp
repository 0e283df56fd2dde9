// The fault matrix: a run of each layout (two processes, or four where the failing rank's groups
// are not the whole world) in which one rank sends itself SIGKILL or SIGSTOP at one phase of step 3
// (TESSERA_FAULT, core/fault_injection.h), table-driven like the equivalence harness. Every cell checks what tessera promises when a rank fails mid-step
// (docs/reliability.md):
//   - the run ends with a non-zero exit, every worker gone, within parallel.timeout_s plus the
//     launcher's 5 s stop grace and a margin (the survivor's 3 s heartbeat probe, a loaded machine);
//   - the failure is named: a killed rank by the launcher ("rank 1 (pid N) killed by signal 9"), a
//     stopped one by the survivor ("rank 1 sent no heartbeat", and the operation it waited in);
//   - a survivor leaves a flight record and `tessera doctor` names the silent rank from it (a killed
//     rank's survivors fail at once: the launcher's SIGTERM cuts their heartbeat diagnosis short, so
//     the run ends within the launcher's grace);
//   - checkpoints/latest is step 2's, complete, and no partial checkpoint outlives the resume;
//   - `train --resume` continues it: steps 3 and 4 log the same loss and gradient norm, bitwise,
//     as the run that never failed.
// `make test` runs six of the cells (the filter in tests/cli/CMakeLists.txt); `make fault-matrix`
// runs them all and prints the table of docs/reliability.md (bench/fault_matrix_table.py) from each
// cell's result, a JSON line appended to $TESSERA_FAULT_MATRIX_RESULTS when that is set.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "cli_util.h"
#include "fault_util.h"

namespace tessera::test {
namespace {

namespace fs = std::filesystem;

constexpr int kTimeoutS = 8;      // parallel.timeout_s of every cell
constexpr int kFaultStep = 3;     // the step the fault comes in; checkpoints every step, 4 steps
constexpr double kStopGraceS = 5;  // the launcher's SIGTERM-to-SIGKILL grace (core/subprocess.h)

struct Layout {
  std::string name;
  std::string settings;             // after "train", before the common settings
  std::vector<std::string> points;  // beyond forward, backward, optimizer, checkpoint.write
  int nproc = 2;
};

const std::vector<Layout>& layouts() {
  static const std::vector<Layout> table = {
      {"dp2_zero3", "--config tiny_gpt --set parallel.zero_stage=3", {"world.reduce_scatter", "world.all_gather"}},
      {"tp2", "--config tiny_gpt --set parallel.tp=2", {"world.all_reduce"}},
      {"sp2_ulysses", "--config tiny_gpt --set parallel.sp=2 --set parallel.sp_method=ulysses", {"world.all_to_all"}},
      {"pp2_1f1b", "--config tiny_gpt --set parallel.pp=2 --set train.grad_accum=2", {"*.send", "*.recv"}},
      {"ep2_moe", "--config tiny_moe --set parallel.ep=2", {"ep.all_to_all", "world.all_reduce"}},
      {"dp2_swap",
       "--config tiny_gpt --set memory.swap=true --set memory.device_budget_gb=1 --set memory.swap_blocks=[1,1]",
       {"swap.load", "swap.store"}},
      // Four processes, tp 2 x dp 2: the last rank's tensor-parallel partner waits for it in a group
      // of two, rank 0 (which never shares a group but the world's with it) in its own.
      {"tp2_dp2_zero1", "--config tiny_gpt --set parallel.tp=2 --set parallel.zero_stage=1", {"*.all_reduce"}, 4},
  };
  return table;
}

struct Cell {
  const Layout* layout;
  std::string point;
  std::string signal;  // KILL or STOP
  int victim;
  std::string name() const {
    return layout->name + "__" + point_in_test_name(point) + "__" + signal + "_rank" + std::to_string(victim);
  }
};

void PrintTo(const Cell& cell, std::ostream* os) { *os << cell.name(); }

// Every layout x point, SIGKILL of the first or the last rank and SIGSTOP of the last.
std::vector<Cell> cells() {
  std::vector<Cell> out;
  for (const Layout& layout : layouts()) {
    std::vector<std::string> points = {"forward", "backward", "optimizer", "checkpoint.write"};
    points.insert(points.end(), layout.points.begin(), layout.points.end());
    for (const std::string& point : points) {
      out.push_back({&layout, point, "KILL", 0});
      out.push_back({&layout, point, "KILL", layout.nproc - 1});
      out.push_back({&layout, point, "STOP", layout.nproc - 1});
    }
  }
  return out;
}

std::string common_settings(const Layout& layout) {
  return tiny_settings(prepared_corpus()) + " --set model.dropout=0 --set eval.every=0 --set train.steps=4" +
         " --set checkpoint.every=1 --set checkpoint.keep=0 --set parallel.timeout_s=" + std::to_string(kTimeoutS) +
         " --nproc " + std::to_string(layout.nproc);
}

// The layout's run that never failed (once per test process).
const std::string& reference(const Layout& layout) {
  static std::map<std::string, std::string> runs;
  auto it = runs.find(layout.name);
  if (it != runs.end()) return it->second;
  const std::string out = fresh_dir("fault_reference_" + layout.name);
  const CommandResult r = run_tessera("train " + layout.settings + common_settings(layout) + " --out " + out);
  if (r.exit_code != 0) throw std::runtime_error("the reference run of " + layout.name + " failed:\n" + r.output);
  return runs.emplace(layout.name, out).first->second;
}

class FaultMatrix : public ::testing::TestWithParam<Cell> {};

TEST_P(FaultMatrix, Cell) {
  const Cell& cell = GetParam();
  const Layout& layout = *cell.layout;
  const std::string& ref = reference(layout);
  const std::string out = fresh_dir("fault_" + cell.name());
  const std::string run = "train " + layout.settings + common_settings(layout) + " --out " + out;
  const std::string fault = std::to_string(cell.victim) + ":" + cell.point + ":" + std::to_string(kFaultStep) + ":" +
                            cell.signal;
  const CommandResult r = run_tessera_env("TESSERA_FAULT=" + fault, run);
  const double ended = wall_now();
  MatrixReport report{{{"layout", layout.name}, {"point", cell.point}, {"signal", cell.signal}, {"victim", cell.victim}}};
  nlohmann::json& result = report.line;

  // The fault came (rank 0 writes to the launcher's output, the others to logs/rank_N.out).
  const std::string victim_said = cell.victim == 0 ? r.output : slurp(out + "/logs/rank_" + std::to_string(cell.victim) + ".out");
  const std::optional<FaultLine> fault_came = fault_line(victim_said, cell.signal, kFaultStep);
  ASSERT_TRUE(fault_came.has_value()) << "the fault never came\n" << r.output;
  const double fault_at = fault_came->at;
  result["end_s"] = ended - fault_at;

  // The run ends, in time, naming the failed rank.
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_LT(ended - fault_at, kTimeoutS + kStopGraceS + 10) << r.output;
  for (int rank = 0; rank < layout.nproc; ++rank)
    EXPECT_EQ(find_worker(out, rank), -1) << "rank " << rank << " still running";
  const std::string victim = "rank " + std::to_string(cell.victim);
  if (cell.signal == "KILL") {
    // The launcher's SIGTERM cuts the survivors' heartbeat diagnosis short: they fail, write their
    // records and exit within the launcher's grace, not at its end (comm/heartbeat.h).
    EXPECT_LT(ended - fault_at, kStopGraceS) << r.output;
    EXPECT_NE(r.output.find("error: " + victim + " (pid "), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(") killed by signal 9"), std::string::npos) << r.output;
  } else {
    const std::string said = r.output + slurp(out + "/logs/rank_0.log");
    EXPECT_NE(said.find(victim + " sent no heartbeat"), std::string::npos) << said;
    // The operation the survivor waited in: a collective or point-to-point operation, or a
    // pipeline action, by name.
    EXPECT_TRUE(std::regex_search(said, std::regex("(all_reduce|reduce_scatter|all_gather|all_to_all|broadcast|barrier|"
                                                   "send|recv)[^\n]* (failed|timed out)|action [A-Z]")))
        << said;
  }
  // The doctor, from a survivor's flight record (rank 0's, or rank 1's where rank 0 failed).
  const std::string survivor_record = out + "/flight/rank_" + std::to_string(cell.victim == 0 ? 1 : 0) + ".json";
  result["survivor_record"] = exists(survivor_record);
  ASSERT_TRUE(exists(survivor_record)) << "the survivor wrote no flight record\n" << r.output;
  const nlohmann::json record = nlohmann::json::parse(slurp(survivor_record));
  result["noticed_s"] = record["written"].get<double>() - fault_at;
  expect_doctor_names_silent_rank(out, cell.victim);

  // The last complete checkpoint is step 2's and resumes to the run that never failed.
  EXPECT_EQ(load_checkpoint(out).step, kFaultStep - 1);
  const CommandResult resumed = run_tessera("train --resume " + out + " --nproc " + std::to_string(layout.nproc));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  const auto want_loss = losses(ref), want_norm = grad_norms(ref), loss = losses(out), norm = grad_norms(out);
  for (int64_t step = kFaultStep; step <= 4; ++step) {
    EXPECT_EQ(loss.at(step), want_loss.at(step)) << "step " << step;
    EXPECT_EQ(norm.at(step), want_norm.at(step)) << "step " << step;
  }
  for (const auto& entry : fs::directory_iterator(out + "/checkpoints"))
    EXPECT_EQ(entry.path().filename().string().find(".partial"), std::string::npos) << entry.path();
  EXPECT_EQ(load_checkpoint(out).step, 4);
}

INSTANTIATE_TEST_SUITE_P(Layouts, FaultMatrix, ::testing::ValuesIn(cells()),
                         [](const ::testing::TestParamInfo<Cell>& info) { return info.param.name(); });

}  // namespace
}  // namespace tessera::test
