// Shared main for tessera's gtest binaries: one intra-op thread (ctest runs two binaries at a
// time on a 2-core machine), deterministic seeds; and the build's paths (test_util.h), the only
// object compiled with them, so that no other test object names the checkout's folder and a fresh
// clone's test objects hit ccache (docs/build.md).
#include <gtest/gtest.h>
#include <torch/torch.h>

namespace tessera::test {
extern const char* const kGoldenDir = TESSERA_GOLDEN_DIR;
extern const char* const kSourceDir = TESSERA_SOURCE_DIR;
extern const char* const kTesseraBinary = TESSERA_BINARY;
}  // namespace tessera::test

int main(int argc, char** argv) {
  at::set_num_threads(1);
  torch::manual_seed(0);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
