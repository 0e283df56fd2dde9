// ParallelDims: the mesh arithmetic every parallelism relies on, checked by hand on 8 ranks.
#include <gtest/gtest.h>

#include "core/error.h"
#include "core/parallel_dims.h"

namespace {

using Ranks = std::vector<std::vector<int64_t>>;

TEST(ParallelDims, FillsDpAndLaysOutTpInnermost) {
  tessera::ParallelOptions o;
  o.tp = 2;
  o.sp = 2;
  tessera::ParallelDims dims(o, 8, "t");
  EXPECT_EQ(dims.dp(), 2);
  EXPECT_EQ(dims.groups("tp"), (Ranks{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(dims.groups("sp"), (Ranks{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(dims.groups("dp"), (Ranks{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(dims.groups("dp_sp"), (Ranks{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  EXPECT_EQ(dims.groups("pp"), (Ranks{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));
  for (int64_t r = 0; r < 8; ++r) EXPECT_EQ(dims.rank(dims.coord(r)), r);
  const tessera::MeshCoord c = dims.coord(6);
  EXPECT_EQ(c.dp, 1);
  EXPECT_EQ(c.sp, 1);
  EXPECT_EQ(c.tp, 0);
}

TEST(ParallelDims, PipelineOutermostAndExpertGroupsInsideDp) {
  tessera::ParallelOptions o;
  o.pp = 2;
  o.ep = 2;
  tessera::ParallelDims dims(o, 8, "t");
  EXPECT_EQ(dims.dp(), 4);
  EXPECT_EQ(dims.groups("pp"), (Ranks{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(dims.groups("dp"), (Ranks{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(dims.groups("ep"), (Ranks{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(dims.groups("edp"), (Ranks{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(dims.groups("edp_sp"), dims.groups("edp"));
  EXPECT_EQ(dims.groups("embedding"), dims.groups("pp"));
  EXPECT_EQ(dims.describe(), "dp=4 tp=1 pp=2 sp=1 ep=2 (world 8)");
}

TEST(ParallelDims, ExpertDataAndEmbeddingGroups) {
  tessera::ParallelOptions o;
  o.pp = 3;
  o.sp = 2;
  o.ep = 2;
  tessera::ParallelDims dims(o, 24, "t");  // dp = 4
  // rank = (pp_i * 4 + dp_i) * 2 + sp_i
  EXPECT_EQ(dims.group_of("edp", 0), (std::vector<int64_t>{0, 4}));
  EXPECT_EQ(dims.group_of("edp", 3), (std::vector<int64_t>{3, 7}));
  EXPECT_EQ(dims.group_of("edp_sp", 0), (std::vector<int64_t>{0, 1, 4, 5}));
  EXPECT_EQ(dims.group_of("edp_sp", 10), (std::vector<int64_t>{10, 11, 14, 15}));
  EXPECT_EQ(dims.group_of("ep", 0), (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(dims.group_of("embedding", 3), (std::vector<int64_t>{3, 19}));
  EXPECT_EQ(dims.group_of("embedding", 19), (std::vector<int64_t>{3, 19}));
  EXPECT_EQ(dims.group_of("embedding", 11), (std::vector<int64_t>{11}));  // a middle stage
  EXPECT_EQ(dims.groups("pp_down"), dims.groups("pp"));  // the same members; comm::Mesh gives it its own backend
  o.ep = 1;
  tessera::ParallelDims no_experts(o, 24, "t");
  EXPECT_EQ(no_experts.groups("edp"), no_experts.groups("dp"));
  EXPECT_EQ(no_experts.groups("edp_sp"), no_experts.groups("dp_sp"));
}

TEST(ParallelDims, RefusesDegreesThatDoNotFit) {
  tessera::ParallelOptions o;
  o.dp = 2;
  o.tp = 2;
  try {
    tessera::ParallelDims dims(o, 8, "cfg.toml");
    FAIL();
  } catch (const tessera::Error& e) {
    EXPECT_STREQ(e.what(), "cfg.toml: parallel.dp * tp * pp * sp = 2 * 2 * 1 * 1 = 4 but the world has 8 ranks");
  }
  o.dp = 0;
  o.zero_stage = 4;
  EXPECT_THROW(tessera::ParallelDims(o, 8, "cfg.toml"), tessera::Error);
}

}  // namespace
