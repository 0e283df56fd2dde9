// Sampling: targets are inputs shifted by one and read from the file at the stated offsets,
// batches are a pure function of (seed, k) so seek() resumes exactly, offsets cover the whole
// valid range, evaluation batches are evenly spaced and stable, short files are named.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <set>

#include "data/sampler.h"
#include "test_util.h"

namespace tessera {
namespace {

TokenFile counting_file(const std::string& name, int64_t n) {
  std::vector<int64_t> tokens(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) tokens[static_cast<size_t>(i)] = (i * 31 + i / 7) % 60000;
  std::string path = test::fresh_dir(name) + "/t.bin";
  write_token_file(path, tokens);
  return TokenFile::open(path);
}

TEST(BatchSampler, TargetsAreInputsShiftedByOneFromTheFile) {
  TokenFile file = counting_file("shift", 5000);
  BatchSampler sampler(file, 4, 32, 7);
  for (int k = 0; k < 3; ++k) {
    Batch batch = sampler.next();
    ASSERT_EQ(batch.inputs.sizes(), torch::IntArrayRef({4, 32}));
    ASSERT_EQ(batch.targets.sizes(), torch::IntArrayRef({4, 32}));
    EXPECT_EQ(batch.inputs.scalar_type(), torch::kLong);
    for (int i = 0; i < 4; ++i) {
      int64_t offset = sampler.offset(k, i);
      EXPECT_TRUE(torch::equal(batch.inputs[i], file.window(offset, 32)));
      EXPECT_TRUE(torch::equal(batch.targets[i], file.window(offset + 1, 32)));
    }
    EXPECT_TRUE(torch::equal(batch.inputs.narrow(1, 1, 31), batch.targets.narrow(1, 0, 31)));
  }
  EXPECT_EQ(sampler.position(), 3);
}

TEST(BatchSampler, IsDeterministicAndResumesExactlyAfterSeek) {
  TokenFile file = counting_file("seek", 3000);
  BatchSampler a(file, 3, 16, 1234), b(file, 3, 16, 1234), other(file, 3, 16, 1235);
  std::vector<Batch> drawn;
  for (int k = 0; k < 6; ++k) drawn.push_back(a.next());
  for (int k = 0; k < 6; ++k) EXPECT_TRUE(torch::equal(b.next().inputs, drawn[k].inputs)) << k;
  EXPECT_FALSE(torch::equal(other.next().inputs, drawn[0].inputs));

  BatchSampler resumed(file, 3, 16, 1234);
  resumed.seek(4);
  EXPECT_EQ(resumed.position(), 4);
  EXPECT_TRUE(torch::equal(resumed.next().inputs, drawn[4].inputs));
  EXPECT_TRUE(torch::equal(resumed.next().targets, drawn[5].targets));
  resumed.seek(1);
  EXPECT_TRUE(torch::equal(resumed.next().inputs, drawn[1].inputs));
  EXPECT_TRUE(test::throws_naming([&] { resumed.seek(-1); }, {file.path(), "position"}));
}

TEST(BatchSampler, OffsetsCoverEveryValidStart) {
  TokenFile file = counting_file("cover", 60);
  BatchSampler sampler(file, 8, 10, 99);
  std::set<int64_t> seen;
  for (int64_t k = 0; k < 200; ++k)
    for (int64_t i = 0; i < 8; ++i) seen.insert(sampler.offset(k, i));
  EXPECT_EQ(seen.size(), 50u);  // starts 0 .. N - T - 1 = 49, all reached in 1600 draws
  EXPECT_EQ(*seen.begin(), 0);
  EXPECT_EQ(*seen.rbegin(), 49);
}

TEST(BatchSampler, ShortFileIsNamedWithTheNeededCount) {
  TokenFile file = counting_file("short", 100);
  EXPECT_TRUE(test::throws_naming([&] { BatchSampler(file, 2, 128, 1); },
                                  {file.path() + ": 100 tokens, need at least 129 for train.seq_len = 128"}));
  EXPECT_TRUE(test::throws_naming([&] { evaluation_batches(file, 1, 1, 100); }, {file.path(), "need at least 101"}));
  EXPECT_NO_THROW(BatchSampler(file, 2, 99, 1).next());
}

TEST(EvaluationBatches, AreEvenlySpacedAndStable) {
  TokenFile file = counting_file("eval", 10001);
  std::vector<Batch> first = evaluation_batches(file, 5, 4, 100);
  std::vector<Batch> again = evaluation_batches(file, 5, 4, 100);
  ASSERT_EQ(first.size(), 5u);
  for (size_t k = 0; k < first.size(); ++k) {
    EXPECT_TRUE(torch::equal(first[k].inputs, again[k].inputs));
    EXPECT_TRUE(torch::equal(first[k].inputs.narrow(1, 1, 99), first[k].targets.narrow(1, 0, 99)));
  }
  // 20 windows over starts 0 .. 9900: the first at 0, the last ending at the end of the file.
  EXPECT_TRUE(torch::equal(first[0].inputs[0], file.window(0, 100)));
  EXPECT_TRUE(torch::equal(first[0].inputs[1], file.window(9900 / 19, 100)));
  EXPECT_TRUE(torch::equal(first[4].targets[3], file.window(9901, 100)));
}

TEST(EvaluationBatches, ShortFilesGiveFewerButAtLeastOne) {
  TokenFile file = counting_file("eval_short", 1001);
  EXPECT_EQ(evaluation_batches(file, 20, 4, 100).size(), 2u);  // 10 disjoint windows = 2 batches of 4
  std::vector<Batch> tiny = evaluation_batches(file, 20, 16, 100);  // 10 windows < one batch of 16
  ASSERT_EQ(tiny.size(), 1u);
  EXPECT_EQ(tiny[0].inputs.size(0), 16);
  EXPECT_TRUE(torch::equal(tiny[0].targets[15], file.window(901, 100)));
}

}  // namespace
}  // namespace tessera
