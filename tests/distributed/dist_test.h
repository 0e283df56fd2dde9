// Multi-rank tests on one machine: a test body that runs as N processes.
//
//   TEST(Comm, AllReduce) {
//     test::Ranks ranks(4);
//     if (!ranks.is_worker()) return ranks.expect_success();
//     auto mesh = ranks.connect();   // a comm::Mesh over Gloo on 127.0.0.1
//     ...                            // gtest assertions, as rank ranks.rank()
//   }
//
// In the gtest process, Ranks(N) starts N copies of the test binary filtered to the current
// test, forked from the binary's rank zygote (rank_zygote.h: a copy that has loaded libtorch
// already); the store's listening socket is bound by the parent and inherited by rank 0, so there
// is no port race. It waits for them with a deadline (a hung rank is killed, never waited on forever),
// and keeps each rank's exit and output. In a copy, Ranks(N) only reads which rank it is.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "comm/mesh.h"
#include "comm/rendezvous.h"
#include "core/parallel_options.h"
#include "core/subprocess.h"

namespace tessera::test {

struct RankResult {
  ChildExit exit;
  std::string output;
};

class Ranks {
 public:
  explicit Ranks(int world_size, double deadline_s = 180);

  bool is_worker() const { return worker_; }
  int64_t rank() const { return launch_.rank; }
  const comm::LaunchInfo& launch() const { return launch_; }

  // Worker side: the mesh for these degrees (default: all data parallel).
  std::unique_ptr<comm::Mesh> connect(ParallelOptions options = {}) const;

  // Parent side.
  const std::vector<RankResult>& results() const { return results_; }
  bool timed_out() const { return timed_out_; }
  // Every rank exited 0 after running this very test (a worker whose filter matched no test
  // would exit 0 too); prints the output of those that did not.
  void expect_success() const;
  // Prints every rank's output lines that start with `prefix` (a test's measurements, shown by
  // ctest -V).
  void print_lines(const std::string& prefix) const;

 private:
  bool worker_ = false;
  comm::LaunchInfo launch_;
  std::vector<RankResult> results_;
  bool timed_out_ = false;
  std::string filter_;  // the test the ranks run, "Suite.Name"
};

}  // namespace tessera::test
