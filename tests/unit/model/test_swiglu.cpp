// SwiGLU's gate as one autograd function (model/swiglu.h) against the ATen composition it
// replaces: output and the joined input's gradient in float64 (to 1e-12), float32 and bf16, on
// contiguous and strided inputs, and what each keeps for the backward.
#include <gtest/gtest.h>

#include <torch/types.h>
#include <torch/utils.h>

#include "memory/saved_activations.h"
#include "model/swiglu.h"
#include "test_util.h"

namespace tessera {
namespace {

at::Tensor swiglu_reference(const at::Tensor& h) {
  const std::vector<at::Tensor> parts = h.chunk(2, -1);
  return parts[0] * at::silu(parts[1]);
}

// Output and input gradient of f and of its reference on the same input and output gradient.
struct Pair {
  at::Tensor y, dx, y_ref, dx_ref;
};
Pair both(const at::Tensor& input, const std::function<at::Tensor(const at::Tensor&)>& f,
          const std::function<at::Tensor(const at::Tensor&)>& reference) {
  Pair out;
  at::Tensor x = input.detach().clone().requires_grad_(true);
  out.y = f(x);
  const at::Tensor dy = at::randn_like(out.y);
  out.y.backward(dy);
  out.dx = x.grad().clone();
  x.mutable_grad() = at::Tensor();
  out.y_ref = reference(x);
  out.y_ref.backward(dy);
  out.dx_ref = x.grad().clone();
  return out;
}

TEST(SwiGLU, EqualsItsCompositionForwardAndBackward) {
  torch::manual_seed(3);
  for (const at::ScalarType dtype : {at::kDouble, at::kFloat, at::kBFloat16}) {
    // A column-parallel output: rows strided (a view of a wider tensor), as well as contiguous.
    const at::Tensor wide = at::randn({3, 5, 2 * 24 + 6}, dtype);
    for (const at::Tensor& h : {at::randn({3, 5, 2 * 24}, dtype), wide.narrow(-1, 3, 2 * 24)}) {
      const Pair p = both(h, swiglu, swiglu_reference);
      const double tol = dtype == at::kBFloat16 ? 2e-2 : dtype == at::kFloat ? 1e-6 : 1e-12;
      EXPECT_EQ(p.y.sizes(), p.y_ref.sizes());
      EXPECT_EQ(p.y.scalar_type(), dtype);
      EXPECT_TRUE(test::all_close(p.y, p.y_ref, tol, tol)) << dtype;
      EXPECT_TRUE(test::all_close(p.dx, p.dx_ref, tol, tol)) << dtype;
    }
  }
}

TEST(SwiGLU, KeepsOnlyItsInputForTheBackward) {
  // What autograd keeps, counted by the saved-activation scope (memory/saved_activations.h, each
  // storage once): the composition keeps u and g (views of h) and silu(g); the function h alone.
  count_saved_activations(true);
  torch::nn::Module none;
  const int64_t rows = 64, H = 32;
  const auto kept = [&](const std::function<at::Tensor(const at::Tensor&)>& f) {
    const at::Tensor h = at::randn({rows, 2 * H}).requires_grad_(true);
    const int64_t before = saved_activation_bytes().live;
    at::Tensor y;
    {
      SavedActivationScope scope(ActivationCodec::none, none);
      y = f(h);
    }
    const int64_t bytes = saved_activation_bytes().live - before;
    y.sum().backward();
    return bytes;
  };
  EXPECT_EQ(kept(swiglu), rows * 2 * H * 4);
  EXPECT_EQ(kept(swiglu_reference), rows * 2 * H * 4 + rows * H * 4);
  count_saved_activations(false);
}

}  // namespace
}  // namespace tessera
