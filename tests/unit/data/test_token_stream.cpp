// TokenStream: llm.c-style shards matched by a glob are one stream in name order, windows cross
// shard boundaries, positions name a shard and an offset, and a pattern that matches nothing is
// named.
#include <gtest/gtest.h>

#include "data/token_stream.h"
#include "test_util.h"

namespace tessera {
namespace {

TEST(TokenStream, ShardsOfAGlobAreOneStreamInNameOrder) {
  const std::string dir = test::fresh_dir("shards");
  // Written out of order; the zero-padded names sort numerically.
  write_token_file(dir + "/fineweb_train_000002.bin", {20, 21, 22});
  write_token_file(dir + "/fineweb_train_000001.bin", {10, 11, 12, 13});
  write_token_file(dir + "/fineweb_val_000000.bin", {1, 2});
  const TokenStream train = TokenStream::open(dir, "fineweb_train_*.bin");
  ASSERT_EQ(train.shards().size(), 2u);
  EXPECT_EQ(train.size(), 7);
  EXPECT_EQ(train.vocab_bound(), 23);
  std::vector<int64_t> all(7);
  train.read(0, 7, all.data());
  EXPECT_EQ(all, (std::vector<int64_t>{10, 11, 12, 13, 20, 21, 22}));
  std::vector<int64_t> across(3);
  train.read(3, 3, across.data());  // the last token of shard 1, the first two of shard 2
  EXPECT_EQ(across, (std::vector<int64_t>{13, 20, 21}));
  EXPECT_EQ(train.locate(3).shard, 0);
  EXPECT_EQ(train.locate(3).offset, 3);
  EXPECT_EQ(train.locate(4).shard, 1);
  EXPECT_EQ(train.locate(4).offset, 0);
  EXPECT_EQ(train.manifest().dump(),
            R"([{"file":"fineweb_train_000001.bin","tokens":4},{"file":"fineweb_train_000002.bin","tokens":3}])");
  EXPECT_TRUE(test::throws_naming([&] { train.read(5, 3, across.data()); }, {"fineweb_train_*.bin", "outside"}));
  EXPECT_EQ(TokenStream::open(dir, "fineweb_val_*.bin").size(), 2);
}

TEST(TokenStream, APatternThatMatchesNothingIsNamed) {
  const std::string dir = test::fresh_dir("no_shards");
  EXPECT_TRUE(test::throws_naming([&] { TokenStream::open(dir, "train_*.bin"); },
                                  {dir + "/train_*.bin", "matches no file"}));
  EXPECT_TRUE(test::throws_naming([&] { TokenStream::open(dir, "train.bin"); }, {dir + "/train.bin", "no such"}));
}

}  // namespace
}  // namespace tessera
