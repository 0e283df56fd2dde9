// The prefetcher hands out exactly the sampler's steps, contiguous, advancing the sampler's
// position as next() would, and honours a seek made between two calls (a resume).
#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include "data/batch_prefetcher.h"
#include "test_util.h"

namespace tessera {
namespace {

TokenStream prefetch_file(int64_t n) {
  std::vector<int64_t> tokens(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) tokens[static_cast<size_t>(i)] = (i * 17 + i / 5) % 50000;
  const std::string dir = test::fresh_dir("prefetch");
  write_token_file(dir + "/t.bin", tokens);
  return TokenStream::open(dir, "t.bin");
}

TEST(BatchPrefetcher, HandsOutTheSamplersStepsContiguousAndKeepsItsPosition) {
  TokenStream file = prefetch_file(4000);
  const BatchLayout layout{3, 2, 1, 2};  // 2 micro-batches of 3 on rank 1 of 2
  BatchSampler reference(file, layout, 16, 99), sampler(file, layout, 16, 99);
  std::vector<std::vector<Batch>> expected;
  for (int k = 0; k < 8; ++k) expected.push_back(reference.next());

  BatchPrefetcher prefetcher(sampler, /*pin=*/false);
  auto check_step = [&](int k) {
    const std::vector<Batch> got = prefetcher.next();
    ASSERT_EQ(got.size(), 2u);
    for (size_t m = 0; m < got.size(); ++m) {
      EXPECT_TRUE(got[m].inputs.is_contiguous() && got[m].targets.is_contiguous());
      EXPECT_TRUE(torch::equal(got[m].inputs, expected[k][m].inputs)) << "step " << k << " micro-batch " << m;
      EXPECT_TRUE(torch::equal(got[m].targets, expected[k][m].targets)) << "step " << k << " micro-batch " << m;
    }
    EXPECT_EQ(sampler.position(), k + 1);
  };
  for (int k = 0; k < 3; ++k) check_step(k);
  sampler.seek(6);  // the step drawn ahead (3) is dropped
  check_step(6);
  check_step(7);
  sampler.seek(1);
  check_step(1);
}

}  // namespace
}  // namespace tessera
