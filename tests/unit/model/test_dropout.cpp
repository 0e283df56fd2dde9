// Dropout on the CPU (model/dropout.h) against torch::dropout from the same generator state: the
// same output and the same gradient, bit for bit, in float32 and bf16; and the mask it keeps for
// the backward is bool, so the lossless codec packs it (ActivationCompression.* measures that).
#include <gtest/gtest.h>

#include <torch/types.h>
#include <torch/utils.h>

#include "model/dropout.h"

namespace tessera {
namespace {

TEST(Dropout, TheBoolMaskDropoutEqualsAtensBitForBit) {
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16})
    for (const double p : {0.1, 0.5, 0.9}) {
      torch::manual_seed(21);
      const at::Tensor base = torch::randn({4, 33, 70}).to(dtype);
      const at::Tensor g = torch::randn({4, 33, 70}).to(dtype);
      const at::Tensor ours = base.clone().requires_grad_(true), theirs = base.clone().requires_grad_(true);
      torch::manual_seed(5);
      const at::Tensor y = dropout(ours, p);
      torch::manual_seed(5);
      const at::Tensor y_ref = torch::dropout(theirs, p, true);
      EXPECT_TRUE(torch::equal(y, y_ref)) << dtype << " p " << p;
      y.backward(g);
      y_ref.backward(g);
      EXPECT_TRUE(torch::equal(ours.grad(), theirs.grad())) << dtype << " p " << p;
      const double dropped = y.eq(0).to(at::kDouble).mean().item<double>();
      EXPECT_NEAR(dropped, p, 0.03) << dtype << " p " << p;
    }
}

}  // namespace
}  // namespace tessera
