// tensors_digest (core/flat_tensors.h): equal values give equal digests, one flipped bit anywhere
// another; dtype and shape count; and its speed, which bounds what a swarm round pays for it.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>

#include <torch/types.h>
#include <torch/utils.h>

#include "core/flat_tensors.h"

namespace tessera {
namespace {

std::vector<at::Tensor> sample() {
  torch::manual_seed(3);
  return {torch::randn({7, 5}), torch::randn({13}), torch::randn({3, 3, 3})};
}

TEST(TensorsDigest, EqualValuesGiveEqualDigestsAndOneFlippedBitAnywhereAnother) {
  const std::vector<at::Tensor> a = sample();
  std::vector<at::Tensor> b;
  for (const at::Tensor& t : a) b.push_back(t.clone());
  const std::string d = tensors_digest(a);
  EXPECT_EQ(d.size(), 16u);
  EXPECT_EQ(d, tensors_digest(b));
  // The last bit of every entry, one at a time (the last entry sits in the odd tail of 13 floats).
  for (size_t k = 0; k < b.size(); ++k) {
    at::Tensor flat = b[k].view({-1});
    for (int64_t i = 0; i < flat.numel(); ++i) {
      const float before = flat[i].item<float>();
      flat[i] = std::nextafter(before, INFINITY);
      EXPECT_NE(tensors_digest(b), d) << "tensor " << k << " entry " << i;
      flat[i] = before;
    }
  }
  EXPECT_EQ(tensors_digest(b), d);
}

TEST(TensorsDigest, DtypeShapeAndOrderCount) {
  const std::vector<at::Tensor> a = sample();
  const std::string d = tensors_digest(a);
  EXPECT_NE(tensors_digest({a[0].reshape({5, 7}), a[1], a[2]}), d);
  EXPECT_NE(tensors_digest({a[1], a[0], a[2]}), d);
  EXPECT_NE(tensors_digest({a[0].view(at::kInt), a[1], a[2]}), d);
  EXPECT_NE(tensors_digest({a[0], a[1]}), d);
  EXPECT_EQ(tensors_digest({a[0].t().contiguous().t(), a[1], a[2]}), d);  // values, not their layout
}

TEST(TensorsDigest, HashesAtLeastAHundredMegabytesASecond) {
  const at::Tensor big = torch::randn({int64_t{16} << 20});  // 64 MiB
  tensors_digest({big});
  const auto start = std::chrono::steady_clock::now();
  tensors_digest({big});
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double mb_per_s = 64.0 * 1.048576 / s;
  std::printf("tensors_digest: %.0f MB/s\n", mb_per_s);
  EXPECT_GT(mb_per_s, 100);
}

}  // namespace
}  // namespace tessera
