// The rank zygote (rank_zygote.h): where it runs, every rank of a multi-process test is forked from
// it rather than exec'd, is a child of the test process (supervise() waits on it), gets its rank's
// environment and rank 0 the store's descriptor at the number the environment names; a rank that
// fails is reported with its exit code as an exec'd one is.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <regex>
#include <string>

#include <ATen/ATen.h>

#include "dist_test.h"
#include "rank_zygote.h"

namespace {

TEST(RankZygote, RanksAreForkedChildrenOfTheTestProcessWithTheirOwnEnvironment) {
  tessera::test::Ranks ranks(3);
  if (!ranks.is_worker()) {
    ranks.expect_success();
    EXPECT_EQ(tessera::test::rank_zygote_running(), tessera::test::rank_zygote_wanted());
    for (size_t r = 0; r < ranks.results().size(); ++r) {
      std::smatch m;
      const std::string& out = ranks.results()[r].output;
      ASSERT_TRUE(std::regex_search(out, m, std::regex("zygote rank (\\d+) parent (\\d+) forked (\\d)"))) << out;
      EXPECT_EQ(std::stoul(m[1]), r);
      EXPECT_EQ(std::stol(m[2]), static_cast<long>(::getpid())) << "rank " << r << " is not the test process's child";
      EXPECT_EQ(m[3] == "1", tessera::test::rank_zygote_wanted()) << "rank " << r;
    }
    return;
  }
  std::printf("zygote rank %s parent %ld forked %d\n", std::getenv("RANK"), static_cast<long>(::getppid()),
              tessera::test::forked_rank() ? 1 : 0);
  std::fflush(stdout);
  EXPECT_EQ(std::to_string(ranks.rank()), std::getenv("TESSERA_TEST_RANK"));
  auto mesh = ranks.connect();  // rank 0 serves the store from the descriptor it inherited
  at::Tensor t = at::ones({4});
  mesh->world().all_reduce(t);
  EXPECT_TRUE(at::equal(t, at::full({4}, 3.0)));
}

TEST(RankZygote, AFailingRankIsReportedWithItsExitCode) {
  tessera::test::Ranks ranks(2);
  if (!ranks.is_worker()) {
    ASSERT_EQ(ranks.results().size(), 2u);
    EXPECT_EQ(ranks.results()[0].exit.code, 0) << ranks.results()[0].output;
    EXPECT_EQ(ranks.results()[1].exit.code, 3) << ranks.results()[1].output;
    return;
  }
  if (ranks.rank() == 1) std::_Exit(3);
}

}  // namespace
