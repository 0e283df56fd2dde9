// Region (checkpoint/region.h): a tensor-parallel part's runs are the elements a strided view of
// the whole tensor picks, parts saved at one tp size assemble into the parts (and ZeRO ranges of
// parts) of another, records round-trip and a bad record is named.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "checkpoint/region.h"
#include "core/error.h"
#include "test_util.h"

namespace tessera::test {
namespace {

// Region `r`'s values read out of the whole tensor `whole`.
at::Tensor values_of(const at::Tensor& whole, const Region& r) {
  at::Tensor out = at::full({r.numel()}, -1.0);
  EXPECT_EQ(copy_overlap(Region::whole(whole.sizes().vec()), whole, r, out), r.numel());
  return out;
}

TEST(Region, ASplitPartIsTheChunkOfEveryBlock) {
  // [2, 12] along dim 1 as 3 blocks (q, k, v) of 2 chunks: rank 1's part is columns 2-3, 6-7, 10-11.
  const at::Tensor whole = at::arange(24, at::kFloat).view({2, 12});
  const Region part = Region::split({2, 12}, 1, 3, 1, 2);
  EXPECT_EQ(part.part_shape(), (std::vector<int64_t>{2, 6}));
  std::vector<int64_t> offsets;
  part.for_each_run([&](int64_t offset, int64_t, int64_t length) {
    offsets.push_back(offset);
    EXPECT_EQ(length, 2);
  });
  EXPECT_EQ(offsets, (std::vector<int64_t>{2, 6, 10, 14, 18, 22}));
  const at::Tensor expected = whole.view({2, 3, 2, 2}).select(2, 1).reshape({-1});
  EXPECT_TRUE(at::equal(values_of(whole, part), expected));
  // A range of the part (a ZeRO rank's slice of it) is that range of the part's values.
  EXPECT_TRUE(at::equal(values_of(whole, part.sub(3, 9)), expected.narrow(0, 3, 6)));
  // One chunk, or no split: the whole tensor.
  EXPECT_FALSE(Region::split({2, 12}, 1, 3, 0, 1).is_split());
  EXPECT_EQ(Region::split({2, 12}, -1, 1, 0, 4).numel(), 24);
}

TEST(Region, PartsSavedAtOneSizeAssembleThePartsOfAnother) {
  // Rows split as tp 2 saves them, read back as tp 4 and as tp 1, and ranges of tp 3's parts.
  const at::Tensor whole = at::randn({12, 5});
  std::vector<Region> saved;
  std::vector<at::Tensor> stored;
  for (int64_t r = 0; r < 2; ++r) {
    saved.push_back(Region::split({12, 5}, 0, 1, r, 2));
    stored.push_back(values_of(whole, saved.back()));
  }
  EXPECT_TRUE(tiles(saved));
  auto assemble = [&](const Region& want) {
    at::Tensor out = at::zeros({want.numel()});
    int64_t covered = 0;
    for (size_t i = 0; i < saved.size(); ++i) covered += copy_overlap(saved[i], stored[i], want, out);
    EXPECT_EQ(covered, want.numel());
    return out;
  };
  for (int64_t r = 0; r < 4; ++r) {
    const Region want = Region::split({12, 5}, 0, 1, r, 4);
    EXPECT_TRUE(at::equal(assemble(want).view(want.part_shape()), whole.narrow(0, 3 * r, 3))) << r;
  }
  EXPECT_TRUE(at::equal(assemble(Region::whole({12, 5})).view({12, 5}), whole));
  const Region third = Region::split({12, 5}, 0, 1, 1, 3).sub(7, 19);
  EXPECT_TRUE(at::equal(assemble(third), whole.narrow(0, 4, 4).reshape({-1}).narrow(0, 7, 12)));
  EXPECT_TRUE(overlaps(saved[0], third));
  EXPECT_FALSE(overlaps(saved[1], Region::split({12, 5}, 0, 1, 0, 4)));

  // Overlapping or missing pieces do not tile.
  EXPECT_FALSE(tiles({saved[0], saved[0], saved[1]}));
  EXPECT_FALSE(tiles({saved[0]}));
  EXPECT_FALSE(tiles({saved[0], Region::split({12, 6}, 0, 1, 1, 2)}));
}

TEST(Region, RecordsRoundTripAndABadOneIsNamed) {
  const Region split = Region::split({4, 6}, 1, 3, 1, 2).sub(1, 5);
  EXPECT_EQ(split.record(), "split 1 3 1 2 1 5 4 6");
  EXPECT_EQ(Region::parse(split.record(), 4, "f"), split);
  // The range form every earlier checkpoint has: "begin shape...", its end from the values.
  const Region range = Region::parse("10 5 7", 22, "f");
  EXPECT_EQ(range, Region::range({5, 7}, 10, 32));
  EXPECT_EQ(range.record(), "10 5 7");
  EXPECT_EQ(Region::parse("0", 1, "f"), Region::whole({}));

  struct Bad {
    const char* record;
    int64_t numel;
    const char* says;
  };
  for (const Bad& b : std::vector<Bad>{{"split 1 3 2 2 0 4 4 6", 4, "names no chunk"},
                                       {"split 1 4 0 2 0 3 4 6", 3, "does not divide dimension 1"},
                                       {"split 2 1 0 2 0 12 4 6", 12, "names no chunk"},
                                       {"split 1 3 0 2 0 13 4 6", 13, "lies outside"},
                                       {"split 1 3 0 2 0 4 4 6", 3, "holds 4 elements, the tensor 3"},
                                       {"split 1 3 0 1 0 4 4 6", 4, "splits into one chunk"},
                                       {"30 5 7", 10, "lies outside"},
                                       {"x 5 7", 1, "malformed"},
                                       {"0 5 -7", 0, "negative dimension"},
                                       {"0 4294967296 4294967296", 0, "overflows"},
                                       {"9223372036854775807 2", 1, "overflows"}})
    EXPECT_TRUE(throws_naming([&] { Region::parse(b.record, b.numel, "shard.safetensors: 'w'"); },
                              {"shard.safetensors: 'w'", b.says}))
        << b.record;
}

}  // namespace
}  // namespace tessera::test
