// Sampling: targets are inputs shifted by one and read from the stream at the stated offsets,
// steps are a pure function of (seed, global batch, k) so seek() resumes exactly, a step is the
// same windows for every decomposition of its global batch, offsets cover the whole valid range,
// evaluation batches are evenly spaced and stable, short streams are named.
#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <set>

#include "data/sampler.h"
#include "test_util.h"

namespace tessera {
namespace {

TokenStream counting_file(const std::string& name, int64_t n) {
  std::vector<int64_t> tokens(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) tokens[static_cast<size_t>(i)] = (i * 31 + i / 7) % 60000;
  std::string dir = test::fresh_dir(name);
  write_token_file(dir + "/t.bin", tokens);
  return TokenStream::open(dir, "t.bin");
}

at::Tensor window(const TokenStream& data, int64_t begin, int64_t length) {
  at::Tensor out = torch::empty({length}, torch::kLong);
  data.read(begin, length, out.data_ptr<int64_t>());
  return out;
}

BatchSampler single(const TokenStream& data, int64_t batch, int64_t seq_len, uint64_t seed) {
  return BatchSampler(data, BatchLayout{batch, 1, 0, 1}, seq_len, seed);
}

TEST(BatchSampler, TargetsAreInputsShiftedByOneFromTheFile) {
  TokenStream file = counting_file("shift", 5000);
  BatchSampler sampler = single(file, 4, 32, 7);
  for (int k = 0; k < 3; ++k) {
    Batch batch = sampler.next().at(0);
    ASSERT_EQ(batch.inputs.sizes(), torch::IntArrayRef({4, 32}));
    ASSERT_EQ(batch.targets.sizes(), torch::IntArrayRef({4, 32}));
    EXPECT_EQ(batch.inputs.scalar_type(), torch::kLong);
    for (int i = 0; i < 4; ++i) {
      int64_t offset = sampler.offset(k, i);
      EXPECT_TRUE(torch::equal(batch.inputs[i], window(file, offset, 32)));
      EXPECT_TRUE(torch::equal(batch.targets[i], window(file, offset + 1, 32)));
    }
    EXPECT_TRUE(torch::equal(batch.inputs.narrow(1, 1, 31), batch.targets.narrow(1, 0, 31)));
  }
  EXPECT_EQ(sampler.position(), 3);
}

TEST(BatchSampler, IsDeterministicAndResumesExactlyAfterSeek) {
  TokenStream file = counting_file("seek", 3000);
  BatchSampler a = single(file, 3, 16, 1234), b = single(file, 3, 16, 1234), other = single(file, 3, 16, 1235);
  std::vector<Batch> drawn;
  for (int k = 0; k < 6; ++k) drawn.push_back(a.next().at(0));
  for (int k = 0; k < 6; ++k) EXPECT_TRUE(torch::equal(b.next().at(0).inputs, drawn[k].inputs)) << k;
  EXPECT_FALSE(torch::equal(other.next().at(0).inputs, drawn[0].inputs));

  BatchSampler resumed = single(file, 3, 16, 1234);
  resumed.seek(4);
  EXPECT_EQ(resumed.position(), 4);
  EXPECT_TRUE(torch::equal(resumed.next().at(0).inputs, drawn[4].inputs));
  EXPECT_TRUE(torch::equal(resumed.next().at(0).targets, drawn[5].targets));
  resumed.seek(1);
  EXPECT_TRUE(torch::equal(resumed.next().at(0).inputs, drawn[1].inputs));
  EXPECT_TRUE(test::throws_naming([&] { resumed.seek(-1); }, {file.name(), "position"}));
}

// 8 windows per step as 1 x 8, 1 rank x 2 micro-batches of 4, 2 ranks x 4, 2 ranks x 2 x 2 and
// 4 ranks x 2: in the order micro-batch m of rank r = (m * dp + r), the same rows every time, so
// the step's gradient is the same whatever the decomposition.
TEST(BatchSampler, AStepIsTheSameWindowsForEveryDecompositionOfItsGlobalBatch) {
  TokenStream file = counting_file("decompose", 4000);
  auto step_rows = [&](int64_t batch, int64_t dp, int64_t accumulation, int64_t step) {
    std::vector<at::Tensor> parts(static_cast<size_t>(dp * accumulation));
    for (int64_t r = 0; r < dp; ++r) {
      BatchSampler sampler(file, BatchLayout{batch, dp, r, accumulation}, 16, 5);
      EXPECT_EQ(sampler.global_batch(), 8);
      sampler.seek(step);
      std::vector<Batch> micro = sampler.next();
      EXPECT_EQ(static_cast<int64_t>(micro.size()), accumulation);
      for (int64_t m = 0; m < accumulation; ++m) parts[static_cast<size_t>(m * dp + r)] = micro[static_cast<size_t>(m)].inputs;
    }
    return torch::cat(parts);
  };
  for (int64_t step : {0, 3}) {
    const at::Tensor whole = step_rows(8, 1, 1, step);
    EXPECT_TRUE(torch::equal(step_rows(4, 1, 2, step), whole)) << step;
    EXPECT_TRUE(torch::equal(step_rows(4, 2, 1, step), whole)) << step;
    EXPECT_TRUE(torch::equal(step_rows(2, 2, 2, step), whole)) << step;
    EXPECT_TRUE(torch::equal(step_rows(2, 4, 1, step), whole)) << step;
  }
  EXPECT_FALSE(torch::equal(step_rows(8, 1, 1, 0), step_rows(8, 1, 1, 1)));
}

TEST(BatchSampler, OffsetsCoverEveryValidStart) {
  TokenStream file = counting_file("cover", 60);
  BatchSampler sampler = single(file, 8, 10, 99);
  std::set<int64_t> seen;
  for (int64_t k = 0; k < 200; ++k)
    for (int64_t i = 0; i < 8; ++i) seen.insert(sampler.offset(k, i));
  EXPECT_EQ(seen.size(), 50u);  // starts 0 .. N - T - 1 = 49, all reached in 1600 draws
  EXPECT_EQ(*seen.begin(), 0);
  EXPECT_EQ(*seen.rbegin(), 49);
}

TEST(BatchSampler, ShortFileIsNamedWithTheNeededCount) {
  TokenStream file = counting_file("short", 100);
  EXPECT_TRUE(test::throws_naming([&] { single(file, 2, 128, 1); },
                                  {file.name() + ": 100 tokens, need at least 129 for train.seq_len = 128"}));
  EXPECT_TRUE(test::throws_naming([&] { evaluation_batches(file, 1, 1, 100); }, {file.name(), "need at least 101"}));
  EXPECT_NO_THROW(single(file, 2, 99, 1).next());
}

TEST(EvaluationBatches, AreEvenlySpacedAndStable) {
  TokenStream file = counting_file("eval", 10001);
  std::vector<Batch> first = evaluation_batches(file, 5, 4, 100);
  std::vector<Batch> again = evaluation_batches(file, 5, 4, 100);
  ASSERT_EQ(first.size(), 5u);
  for (size_t k = 0; k < first.size(); ++k) {
    EXPECT_TRUE(torch::equal(first[k].inputs, again[k].inputs));
    EXPECT_TRUE(torch::equal(first[k].inputs.narrow(1, 1, 99), first[k].targets.narrow(1, 0, 99)));
  }
  // 20 windows over starts 0 .. 9900: the first at 0, the last ending at the end of the file.
  EXPECT_TRUE(torch::equal(first[0].inputs[0], window(file, 0, 100)));
  EXPECT_TRUE(torch::equal(first[0].inputs[1], window(file, 9900 / 19, 100)));
  EXPECT_TRUE(torch::equal(first[4].targets[3], window(file, 9901, 100)));
}

TEST(EvaluationBatches, ShortFilesGiveFewerButAtLeastOne) {
  TokenStream file = counting_file("eval_short", 1001);
  EXPECT_EQ(evaluation_batches(file, 20, 4, 100).size(), 2u);  // 10 disjoint windows = 2 batches of 4
  std::vector<Batch> tiny = evaluation_batches(file, 20, 16, 100);  // 10 windows < one batch of 16
  ASSERT_EQ(tiny.size(), 1u);
  EXPECT_EQ(tiny[0].inputs.size(0), 16);
  EXPECT_TRUE(torch::equal(tiny[0].targets[15], window(file, 901, 100)));
}

}  // namespace
}  // namespace tessera
