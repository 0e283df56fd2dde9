// comm::resolve_device (one GPU per local rank) and comm::choose_backend (Gloo on the CPU, NCCL on
// CUDA), both as pure rules, and Mesh::connect refusing a backend before it touches the network.
// These run without a GPU: the visible GPU count is an argument of resolve_device.
#include <gtest/gtest.h>

#include "comm/device.h"
#include "comm/mesh.h"
#include "test_util.h"

namespace tessera {
namespace {

// Rank `rank` of `world` processes spread over nodes of `per_node` each.
comm::LaunchInfo launch(int64_t rank, int64_t world, int64_t per_node) {
  comm::LaunchInfo l;
  l.rank = rank;
  l.world_size = world;
  l.local_rank = rank % per_node;
  l.local_world_size = per_node;
  l.launcher = "tessera";
  return l;
}

const c10::Device kCpu(c10::kCPU);
c10::Device cuda(int index) { return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index)); }

TEST(CommDevice, CudaIsTheGpuOfTheLocalRank) {
  EXPECT_EQ(comm::resolve_device("cuda", comm::LaunchInfo(), 1), cuda(0));
  EXPECT_EQ(comm::resolve_device("cuda", launch(0, 2, 2), 2), cuda(0));
  EXPECT_EQ(comm::resolve_device("cuda", launch(1, 2, 2), 2), cuda(1));
  EXPECT_EQ(comm::resolve_device("cuda", launch(1, 2, 2), 8), cuda(1));
  // Two nodes of four: global rank 6 is local rank 2 of its node.
  EXPECT_EQ(comm::resolve_device("cuda", launch(6, 8, 4), 4), cuda(2));
  EXPECT_EQ(comm::resolve_device("cpu", launch(1, 2, 2), 0), kCpu);
  EXPECT_EQ(comm::select_device("cpu", launch(1, 2, 2)), kCpu);  // asks the CUDA runtime nothing
}

TEST(CommDevice, TooFewGpusForTheLocalRankIsRefused) {
  EXPECT_TRUE(test::throws_naming([] { comm::resolve_device("cuda", launch(1, 2, 2), 1); },
                                  {"train.device", "rank 1 (local rank 1 of 2", "needs cuda:1", "1 CUDA device is visible",
                                   "at most one process per GPU"}));
  EXPECT_TRUE(test::throws_naming([] { comm::resolve_device("cuda", launch(7, 8, 4), 2); },
                                  {"train.device", "rank 7 (local rank 3 of 4", "needs cuda:3", "2 CUDA devices"}));
}

TEST(CommDevice, NoGpuIsRefusedNamingTheKey) {
  EXPECT_TRUE(test::throws_naming([] { comm::resolve_device("cuda", comm::LaunchInfo(), 0); },
                                  {"train.device = \"cuda\"", "no CUDA device is available to the single process"}));
  EXPECT_TRUE(test::throws_naming([] { comm::resolve_device("cuda:0", launch(1, 4, 1), 0); },
                                  {"train.device = \"cuda:0\"", "no CUDA device", "rank 1"}));
#ifndef TESSERA_WITH_CUDA
  EXPECT_TRUE(test::throws_naming([] { comm::select_device("cuda", comm::LaunchInfo()); },
                                  {"train.device = \"cuda\"", "TESSERA_CUDA=OFF"}));
#endif
}

TEST(CommDevice, AnExplicitIndexIsForOneProcessPerNode) {
  EXPECT_EQ(comm::resolve_device("cuda:1", comm::LaunchInfo(), 2), cuda(1));
  EXPECT_EQ(comm::resolve_device("cuda:1", launch(3, 4, 1), 2), cuda(1));  // four nodes, one process each
  EXPECT_TRUE(test::throws_naming([] { comm::resolve_device("cuda:0", launch(0, 2, 2), 2); },
                                  {"train.device = \"cuda:0\"", "all 2 processes of this node", "rank 0",
                                   "share one GPU", "train.device = \"cuda\""}));
  // Named as a layout mistake even where no GPU is visible.
  EXPECT_TRUE(test::throws_naming([] { comm::resolve_device("cuda:0", launch(1, 2, 2), 0); },
                                  {"train.device = \"cuda:0\"", "all 2 processes of this node"}));
  EXPECT_TRUE(test::throws_naming([] { comm::resolve_device("cuda:2", comm::LaunchInfo(), 2); },
                                  {"train.device = \"cuda:2\"", "only 2 CUDA devices are visible"}));
}

TEST(CommDevice, NotADeviceIsRefusedNamingTheKey) {
  EXPECT_TRUE(test::throws_naming([] { comm::resolve_device("cuda:x", comm::LaunchInfo(), 1); },
                                  {"train.device = \"cuda:x\" is not a device"}));
}

TEST(CommBackend, AutoIsGlooOnTheCpuAndNcclOnCuda) {
  EXPECT_EQ(comm::choose_backend("auto", kCpu), "gloo");
  EXPECT_EQ(comm::choose_backend("gloo", kCpu), "gloo");
#ifdef TESSERA_WITH_CUDA
  EXPECT_EQ(comm::choose_backend("auto", cuda(0)), "nccl");
  EXPECT_EQ(comm::choose_backend("nccl", cuda(1)), "nccl");
#endif
}

TEST(CommBackend, MismatchedBackendAndDeviceAreRefused) {
  EXPECT_TRUE(test::throws_naming([] { comm::choose_backend("nccl", kCpu); },
                                  {"parallel.backend = \"nccl\"", "needs train.device = cuda", "got cpu"}));
  EXPECT_TRUE(test::throws_naming([] { comm::choose_backend("gloo", cuda(0)); },
                                  {"parallel.backend = \"gloo\"", "train.device = cuda:0", "\"nccl\""}));
}

#ifndef TESSERA_WITH_CUDA
// Never a silent fallback to Gloo: NCCL asked for, explicitly or by auto on CUDA, in a CPU build.
TEST(CommBackend, NcclInABuildWithoutCudaIsRefused) {
  EXPECT_TRUE(test::throws_naming([] { comm::choose_backend("nccl", cuda(0)); },
                                  {"parallel.backend = \"nccl\"", "train.device = cuda:0", "TESSERA_CUDA=OFF"}));
  EXPECT_TRUE(test::throws_naming([] { comm::choose_backend("auto", cuda(0)); },
                                  {"parallel.backend = \"auto\" (nccl)", "train.device = cuda:0", "TESSERA_CUDA=OFF"}));
}
#endif

// The refusal comes from Mesh::connect before any store or socket exists (no peer is running).
TEST(CommBackend, MeshRefusesNcclOnTheCpuBeforeConnecting) {
  ParallelOptions options;
  options.backend = "nccl";
  const ParallelDims dims(options, 2, "test.toml");
  EXPECT_TRUE(test::throws_naming([&] { comm::Mesh::connect(launch(1, 2, 2), dims, options, kCpu); },
                                  {"parallel.backend = \"nccl\"", "train.device = cuda"}));
  // A world of one has no backend: the same options connect.
  const ParallelDims one(options, 1, "test.toml");
  EXPECT_EQ(comm::Mesh::connect(comm::LaunchInfo(), one, options, kCpu)->world().size(), 1);
}

}  // namespace
}  // namespace tessera
