// The fault matrix's swarm cells: three `tessera peer`s train together and one of them sends
// itself SIGKILL or SIGSTOP (TESSERA_FAULT, core/fault_injection.h) at one phase of its step 3:
// its forward or update, or the start, the reduce or the sum of an averaging round. The swarm
// must carry on: the two others go on averaging without it and finish (swarm step 12), in step
// with each other (their final parameters equal, bit for bit), with every sample they processed
// accounted for. Each cell's result (and the seconds from the fault to the survivors' next
// completed round) is a JSON line in $TESSERA_FAULT_MATRIX_RESULTS when that is set, as for the
// other cells (test_fault_matrix.cpp).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "fault_util.h"
#include "swarm_util.h"

namespace tessera::test {
namespace {

constexpr int64_t kSteps = 12;
constexpr int kSwarmFaultStep = 3;

struct SwarmCell {
  std::string point;
  std::string signal;
  std::string name() const { return point_in_test_name(point) + "__" + signal; }
};

void PrintTo(const SwarmCell& cell, std::ostream* os) { *os << cell.name(); }

std::vector<SwarmCell> swarm_cells() {
  std::vector<SwarmCell> out;
  for (const char* point : {"forward", "optimizer", "swarm.group", "swarm.reduce", "swarm.sum"})
    for (const char* signal : {"KILL", "STOP"}) out.push_back({point, signal});
  return out;
}

// Waits up to `seconds` for `p` to exit; its exit code (-signal when killed), or nullopt.
std::optional<int> exit_within(const Peer& p, double seconds) {
  for (int i = 0; i < static_cast<int>(seconds * 20); ++i) {
    int status = 0;
    if (::waitpid(p.pid, &status, WNOHANG) == p.pid) return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return std::nullopt;
}

class SwarmFaults : public SwarmFixture, public ::testing::WithParamInterface<SwarmCell> {};

TEST_P(SwarmFaults, Cell) {
  const SwarmCell& cell = GetParam();
  MatrixReport report{{{"layout", "swarm3"}, {"point", cell.point}, {"signal", cell.signal}, {"victim", 2}}};
  // Every peer waits for the other two before its first step (swarm.min_peers), so the three train
  // together from the start: with min_peers 1 the first started raced alone through the 12 tiny
  // steps before the others joined, and the cell tested nothing.
  const std::string args = settings(kSteps, key_) + " --set swarm.min_peers=3";
  Peer& first = start("first", args);
  Peer& second = start("second", args, first.address());
  const std::string fault = "0:" + cell.point + ":" + std::to_string(kSwarmFaultStep) + ":" + cell.signal;
  Peer& victim = start("victim", args, first.address(), {{"TESSERA_FAULT", fault}});

  ASSERT_TRUE(wait_until([&] { return fault_line(victim.log(), cell.signal, -1).has_value(); }, 90))
      << "the fault never came\n" << victim.log();
  const std::string said = victim.log();
  const FaultLine came = *fault_line(said, cell.signal, -1);
  const double fault_at = came.at;
  // It averaged with both others before the fault.
  EXPECT_NE(said.substr(0, came.position).find(": 3 peers"), std::string::npos) << said;
  // The survivors' next completed round after the fault.
  const int64_t at = std::max(first.swarm_step(), second.swarm_step());
  if (wait_until([&] { return first.swarm_step() > at && second.swarm_step() > at; }, 60))
    report.line["recovered_s"] = wall_now() - fault_at;

  // The two others finish together.
  for (Peer* p : {&first, &second}) {
    const std::optional<int> code = exit_within(*p, 180);
    ASSERT_TRUE(code.has_value()) << "a survivor did not finish\n" << p->log();
    EXPECT_EQ(*code, 0) << p->log();
    EXPECT_EQ(p->swarm_step(), kSteps) << p->log();
    expect_accounted(*p);
  }
  const std::string final_step = "/checkpoints/step_" + std::to_string(kSteps) + "/model.safetensors";
  const std::string a = slurp(first.dir + final_step);
  EXPECT_FALSE(a.empty());
  EXPECT_TRUE(a == slurp(second.dir + final_step)) << "the survivors ended apart";
  report.line["end_s"] = wall_now() - fault_at;
}

INSTANTIATE_TEST_SUITE_P(Swarm, SwarmFaults, ::testing::ValuesIn(swarm_cells()),
                         [](const ::testing::TestParamInfo<SwarmCell>& info) { return info.param.name(); });

}  // namespace
}  // namespace tessera::test
