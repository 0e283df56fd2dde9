// Shared main for tessera's gtest binaries: the rank zygote where the binary has one
// (rank_zygote.h), one intra-op thread (ctest runs two binaries at a time on a 2-core machine),
// deterministic seeds, exit 77 when every case skipped, _exit after the last case; and the build's paths (test_util.h), the only object compiled with them,
// so that no other test object names the checkout's folder and a fresh clone's test objects hit
// ccache (docs/build.md).
#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include "core/process_end.h"

namespace tessera::test {
extern const char* const kGoldenDir = TESSERA_GOLDEN_DIR;
extern const char* const kSourceDir = TESSERA_SOURCE_DIR;
extern const char* const kTesseraBinary = TESSERA_BINARY;
// Defined in the binaries with multi-process tests (distributed/rank_zygote.h), which fork their
// rank zygote here, before anything else runs; a rank it starts returns from it with its own argv.
void start_rank_zygote(int& argc, char**& argv) __attribute__((weak));
}  // namespace tessera::test

int main(int argc, char** argv) {
  if (tessera::test::start_rank_zygote) tessera::test::start_rank_zygote(argc, argv);
  at::set_num_threads(1);
  torch::manual_seed(0);
  ::testing::InitGoogleTest(&argc, argv);
  int failed = RUN_ALL_TESTS();
  // 77, CTest's SKIP_RETURN_CODE (tests/CMakeLists.txt), when every case that ran skipped: an
  // entry with one passing case beside a skipped one passes, and prints the skipped case.
  const auto& unit = *::testing::UnitTest::GetInstance();
  const int code = failed == 0 && unit.successful_test_count() == 0 && unit.skipped_test_count() > 0 ? 77 : failed;
  return tessera::end_process(code);  // no static destructors (core/process_end.h)
}
