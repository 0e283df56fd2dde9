// Shared main for tessera's gtest binaries: one intra-op thread (ctest runs two binaries at a
// time on a 2-core machine), deterministic seeds.
#include <gtest/gtest.h>
#include <torch/torch.h>

int main(int argc, char** argv) {
  at::set_num_threads(1);
  torch::manual_seed(0);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
