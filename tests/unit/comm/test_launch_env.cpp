// launch_info_from_environment(): how a process launched by mpirun (Open MPI, MPICH/Hydra PMI)
// or srun learns its place in the world, and the error when such a launch does not say where the
// store is. The variables are set in this process for each case and removed after it.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <string>

#include "comm/rendezvous.h"
#include "test_util.h"

namespace tessera::comm {
namespace {

// Sets `vars` for its lifetime (and nothing else a launcher would set).
class Environment {
 public:
  explicit Environment(std::map<std::string, std::string> vars) : vars_(std::move(vars)) {
    for (const char* stray : {"TESSERA_LAUNCHER", "TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK",
                              "PMI_RANK", "SLURM_PROCID", "MASTER_ADDR", "MASTER_PORT"})
      EXPECT_EQ(std::getenv(stray), nullptr) << stray << " is set in the test's environment";
    for (const auto& [name, value] : vars_) setenv(name.c_str(), value.c_str(), 1);
  }
  ~Environment() {
    for (const auto& [name, value] : vars_) unsetenv(name.c_str());
  }

 private:
  std::map<std::string, std::string> vars_;
};

const std::map<std::string, std::string> kStore = {{"MASTER_ADDR", "10.1.2.3"}, {"MASTER_PORT", "29511"}};

std::map<std::string, std::string> with_store(std::map<std::string, std::string> vars) {
  vars.insert(kStore.begin(), kStore.end());
  return vars;
}

void expect_place(const LaunchInfo& info, const std::string& launcher, int64_t rank, int64_t world, int64_t local,
                  int64_t local_world) {
  EXPECT_EQ(info.launcher, launcher);
  EXPECT_EQ(info.rank, rank);
  EXPECT_EQ(info.world_size, world);
  EXPECT_EQ(info.local_rank, local);
  EXPECT_EQ(info.local_world_size, local_world);
  EXPECT_EQ(info.master_addr, "10.1.2.3");
  EXPECT_EQ(info.master_port, 29511);
}

TEST(LaunchEnvironment, OpenMpi) {
  Environment env(with_store({{"OMPI_COMM_WORLD_RANK", "5"}, {"OMPI_COMM_WORLD_SIZE", "8"},
                              {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}}));
  expect_place(launch_info_from_environment(), "mpirun", 5, 8, 1, 4);
}

TEST(LaunchEnvironment, MpichHydraPmi) {
  Environment env(with_store({{"PMI_RANK", "2"}, {"PMI_SIZE", "3"}, {"MPI_LOCALRANKID", "0"}, {"MPI_LOCALNRANKS", "1"}}));
  expect_place(launch_info_from_environment(), "mpirun", 2, 3, 0, 1);
}

TEST(LaunchEnvironment, Slurm) {
  Environment env(with_store({{"SLURM_PROCID", "7"}, {"SLURM_NTASKS", "16"}, {"SLURM_LOCALID", "3"},
                              {"SLURM_NTASKS_PER_NODE", "4"}}));
  expect_place(launch_info_from_environment(), "srun", 7, 16, 3, 4);
}

TEST(LaunchEnvironment, OneSlurmTaskIsASingleProcess) {
  Environment env({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}});
  const LaunchInfo info = launch_info_from_environment();
  EXPECT_EQ(info.launcher, "single");
  EXPECT_EQ(info.world_size, 1);
}

TEST(LaunchEnvironment, MpiWithoutAStoreAddressIsRefusedNamingWhatToSet) {
  Environment env({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}});
  EXPECT_TRUE(test::throws_naming([] { launch_info_from_environment(); }, {"mpirun", "MASTER_ADDR", "MASTER_PORT"}));
}

TEST(LaunchEnvironment, RankOutsideTheWorldIsRefused) {
  Environment env(with_store({{"SLURM_PROCID", "4"}, {"SLURM_NTASKS", "4"}}));
  EXPECT_TRUE(test::throws_naming([] { launch_info_from_environment(); }, {"srun", "rank 4", "world of 4"}));
}

}  // namespace
}  // namespace tessera::comm
