// all_finite (core/flat_tensors.h): agrees with at::isfinite(t).all() on every placement of a NaN or
// an infinity (first, last, either side of its block boundary), on other dtypes, strided and empty
// tensors; and its one pass is faster than at::isfinite's.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <limits>

#include <torch/types.h>
#include <torch/utils.h>

#include "core/flat_tensors.h"

namespace tessera {
namespace {

bool reference(const at::Tensor& t) { return at::isfinite(t).all().item<bool>(); }

TEST(AllFinite, FindsANaNOrAnInfinityWhereverItIs) {
  torch::manual_seed(5);
  const at::Tensor base = torch::randn({3 * 4096 + 17}) * 1e30;  // large finite values too
  ASSERT_TRUE(all_finite(base));
  const float bad[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                       -std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::quiet_NaN()};
  for (const int64_t at : {int64_t{0}, int64_t{1}, int64_t{4095}, int64_t{4096}, int64_t{8191}, base.numel() - 1})
    for (const float v : bad) {
      at::Tensor t = base.clone();
      t[at] = v;
      EXPECT_FALSE(all_finite(t)) << "value " << v << " at " << at;
      EXPECT_EQ(all_finite(t), reference(t));
    }
  // The largest finite value and the smallest subnormal are finite.
  at::Tensor edge = base.clone();
  edge[7] = std::numeric_limits<float>::max();
  edge[8] = -std::numeric_limits<float>::max();
  edge[9] = std::numeric_limits<float>::denorm_min();
  EXPECT_TRUE(all_finite(edge));
}

TEST(AllFinite, OtherDtypesStridedAndEmptyTensorsAgreeWithIsfinite) {
  torch::manual_seed(6);
  at::Tensor m = torch::randn({64, 33});
  m[5][7] = std::numeric_limits<float>::infinity();
  const at::Tensor strided = m.t();  // not contiguous
  EXPECT_FALSE(all_finite(strided));
  EXPECT_FALSE(all_finite(m.to(at::kBFloat16)));
  EXPECT_FALSE(all_finite(m.to(at::kDouble)));
  EXPECT_TRUE(all_finite(m.narrow(0, 6, 10)));
  EXPECT_TRUE(all_finite(torch::empty({0})));
  EXPECT_TRUE(all_finite(torch::arange(10)));  // integers are finite
  // A list: float32 read in place beside others through isfinite; any one non-finite entry decides.
  const at::Tensor clean = torch::randn({100});
  EXPECT_TRUE(all_finite(std::vector<at::Tensor>{clean, clean.to(at::kBFloat16), clean.to(at::kDouble)}));
  EXPECT_FALSE(all_finite(std::vector<at::Tensor>{clean, m.to(at::kBFloat16), clean}));
  EXPECT_FALSE(all_finite(std::vector<at::Tensor>{clean.to(at::kDouble), m}));
  EXPECT_TRUE(all_finite(std::vector<at::Tensor>{}));
}

TEST(AllFinite, OnePassIsFasterThanIsfinite) {
  const at::Tensor big = torch::randn({int64_t{16} << 20});  // 64 MiB
  const auto seconds = [&](auto&& f) {
    f();
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < 3; ++i) f();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / 3;
  };
  const double ours = seconds([&] { EXPECT_TRUE(all_finite(big)); });
  const double theirs = seconds([&] { EXPECT_TRUE(reference(big)); });
  std::printf("all_finite: %.0f MB/s, at::isfinite(t).all(): %.0f MB/s\n", 64 * 1.048576 / ours,
              64 * 1.048576 / theirs);
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)  // our loop is instrumented there, libtorch's not
  EXPECT_LT(ours, theirs);
#endif
}

}  // namespace
}  // namespace tessera
