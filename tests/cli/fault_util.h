// What the tests of failing multi-process runs share (test_distributed.cpp, test_fault_matrix.cpp):
// the losses and gradient norms a run logged, its workers' pids, and the doctor's verdict.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <string>

#include <gtest/gtest.h>

#include "cli_util.h"

namespace tessera::test {

// Per step, the value of `key` in RUN_DIR/metrics.jsonl.
inline std::map<int64_t, double> logged(const std::string& run_dir, const char* key) {
  std::map<int64_t, double> out;
  for (const auto& line : metrics_lines(run_dir))
    if (line.contains(key)) out[line["step"]] = line[key];
  return out;
}
inline std::map<int64_t, double> losses(const std::string& run_dir) { return logged(run_dir, "loss"); }
// The gradient norm before clipping: a factor-N error in a reduction shows here, not in AdamW's losses.
inline std::map<int64_t, double> grad_norms(const std::string& run_dir) { return logged(run_dir, "grad_norm"); }

// The pid of the worker of `run_dir` with RANK=rank, or -1.
inline pid_t find_worker(const std::string& run_dir, int rank) {
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string cmdline = slurp(entry.path().string() + "/cmdline");
    const std::string environ = slurp(entry.path().string() + "/environ");
    if (cmdline.find(run_dir) == std::string::npos) continue;
    if (environ.find(std::string("\0RANK=", 6) + std::to_string(rank) + '\0') != std::string::npos &&
        environ.find("TESSERA_LAUNCHER=1") != std::string::npos)
      return static_cast<pid_t>(std::stol(name));
  }
  return -1;
}

// After a run whose rank `silent` was killed or stopped: it wrote no flight record, at least one
// other rank did (its collective failed), and `tessera doctor` names it where the run stopped,
// with a survivor waiting in an operation.
inline void expect_doctor_names_silent_rank(const std::string& out, int silent) {
  EXPECT_FALSE(exists(out + "/flight/rank_" + std::to_string(silent) + ".json"));
  const CommandResult doctor = run_tessera("doctor " + out);
  ASSERT_EQ(doctor.exit_code, 0) << doctor.output;
  EXPECT_NE(doctor.output.find("running for"), std::string::npos) << doctor.output;
  const std::regex verdict("where the run stopped: ranks? ([0-9, ]+) \\(no record\\); ranks? [0-9, ]+ waited for");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(doctor.output, m, verdict)) << doctor.output;
  const std::string listed = ", " + m[1].str() + ",";
  EXPECT_NE(listed.find(", " + std::to_string(silent) + ","), std::string::npos) << doctor.output;
}

// A fault-matrix cell's line of the table (bench/fault_matrix_table.py), appended to
// $TESSERA_FAULT_MATRIX_RESULTS when that is set, with "passed", however the cell ends.
struct MatrixReport {
  nlohmann::json line;
  ~MatrixReport() {
    line["passed"] = !::testing::Test::HasFailure();
    if (const char* file = std::getenv("TESSERA_FAULT_MATRIX_RESULTS"))
      std::ofstream(file, std::ios::app) << line.dump() << "\n";
  }
};

// The victim's own line (core/fault_injection.h) in `text`, for SIG`signal` in step `step` (any
// step when negative): where the line starts and the wall time the fault came at; nullopt when the
// fault never came.
struct FaultLine {
  size_t position;
  double at;
};
inline std::optional<FaultLine> fault_line(const std::string& text, const std::string& signal, int64_t step) {
  const std::regex line("TESSERA_FAULT: rank [0-9]+ sends itself SIG" + signal + " at [a-z_.]+ in step " +
                        (step < 0 ? std::string("[0-9]+") : std::to_string(step)) + " \\(at ([0-9.]+)\\)");
  std::smatch m;
  if (!std::regex_search(text, m, line)) return std::nullopt;
  return FaultLine{static_cast<size_t>(m.position(0)), std::stod(m[1])};
}

// A fault point as part of a test's name: "swarm.sum" -> "swarm_sum", "*.send" -> "x_send".
inline std::string point_in_test_name(std::string point) {
  for (char& c : point)
    if (c == '.') c = '_';
    else if (c == '*') c = 'x';
  return point;
}

// Seconds since the epoch, as TESSERA_FAULT's line gives the fault's time.
inline double wall_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace tessera::test
