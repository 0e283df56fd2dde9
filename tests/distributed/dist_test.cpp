#include "dist_test.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "rank_zygote.h"
#include "test_util.h"

namespace tessera::test {
namespace fs = std::filesystem;

Ranks::Ranks(int world_size, double deadline_s) {
  if (std::getenv("TESSERA_TEST_RANK")) {
    worker_ = true;
    launch_ = comm::launch_info_from_environment();
    EXPECT_EQ(launch_.world_size, world_size);
    return;
  }
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string filter = std::string(info->test_suite_name()) + "." + info->name();
  filter_ = filter;
  const std::string dir = fresh_dir("ranks_" + filter);
  const comm::ListenSocket store = comm::listen_on("127.0.0.1", 0);
  std::vector<pid_t> pids;
  for (int r = 0; r < world_size; ++r) {
    comm::LaunchInfo worker;
    worker.rank = worker.local_rank = r;
    worker.world_size = worker.local_world_size = world_size;
    worker.master_port = store.port;
    ChildSpec spec;
    spec.argv = {fs::read_symlink("/proc/self/exe").string(), "--gtest_filter=" + filter};
    spec.env = comm::worker_environment(worker, store.fd);
    spec.env["TESSERA_TEST_RANK"] = std::to_string(r);
    if (r == 0) spec.inherit_fd = store.fd;
    spec.output_file = dir + "/rank_" + std::to_string(r) + ".log";
    pids.push_back(spawn_rank(spec));
  }
  ::close(store.fd);
  SuperviseOptions options;
  options.deadline_s = deadline_s;
  options.stop_on_failure = false;
  const SuperviseResult result = supervise(pids, options);
  timed_out_ = result.timed_out;
  for (int r = 0; r < world_size; ++r) {
    std::ifstream in(dir + "/rank_" + std::to_string(r) + ".log");
    std::stringstream text;
    text << in.rdbuf();
    results_.push_back({result.exits[r], text.str()});
  }
}

std::unique_ptr<comm::Mesh> Ranks::connect(ParallelOptions options) const {
  ParallelDims dims(options, launch_.world_size, "test");
  return comm::Mesh::connect(launch_, dims, options, c10::Device(c10::kCPU));
}

void Ranks::expect_success() const {
  EXPECT_FALSE(timed_out_) << "a rank did not finish before the deadline and was killed";
  for (size_t r = 0; r < results_.size(); ++r) {
    EXPECT_TRUE(results_[r].exit.code == 0) << "rank " << r << " " << results_[r].exit.describe() << "; its output:\n"
                                       << results_[r].output;
    EXPECT_NE(results_[r].output.find("[ RUN      ] " + filter_), std::string::npos)
        << "rank " << r << " ran no test named " << filter_ << "; its output:\n" << results_[r].output;
  }
}

void Ranks::print_lines(const std::string& prefix) const {
  for (const RankResult& result : results_) {
    std::istringstream lines(result.output);
    for (std::string line; std::getline(lines, line);)
      if (line.rfind(prefix, 0) == 0) std::printf("%s\n", line.c_str());
  }
}

}  // namespace tessera::test
