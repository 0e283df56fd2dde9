// Lightning attention: the chunked form equals the token recurrence (and, for the backward pass,
// its autograd gradients) to float32 rounding for chunk sizes 1, 3, 8 (dividing T) and 7 and 40
// (not dividing T; 40 > T); a sequence split in two with the carried state equals the whole; the
// ALiBi slopes follow the paper's rule.
//
// Tolerance: rtol 1e-5, atol 1e-5 on outputs of magnitude ~1: the two forms sum the same terms in
// different orders.
#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <cmath>

#include "model/linear_attention.h"
#include "test_util.h"

namespace tessera {
namespace {

struct Qkv {
  at::Tensor q, k, v, decay;
};

Qkv random_qkv(int64_t B, int64_t H, int64_t T, int64_t dk, int64_t dv) {
  torch::manual_seed(3);
  Qkv r{torch::randn({B, H, T, dk}) * 0.5, torch::randn({B, H, T, dk}) * 0.5, torch::randn({B, H, T, dv}),
        at::exp(-alibi_slopes(H))};
  return r;
}

class ChunkSizes : public ::testing::TestWithParam<int64_t> {};

TEST_P(ChunkSizes, ChunkedEqualsRecurrentOutputStateAndGradients) {
  auto in = random_qkv(2, 4, 24, 8, 6);
  auto q1 = in.q.clone().requires_grad_(), k1 = in.k.clone().requires_grad_(), v1 = in.v.clone().requires_grad_();
  auto q2 = in.q.clone().requires_grad_(), k2 = in.k.clone().requires_grad_(), v2 = in.v.clone().requires_grad_();
  at::Tensor state_chunked, state_recurrent;
  auto o1 = lightning_attention_chunked(q1, k1, v1, in.decay, GetParam(), {}, &state_chunked);
  auto o2 = linear_attention_recurrent(q2, k2, v2, in.decay, {}, &state_recurrent);
  EXPECT_TRUE(test::all_close(o1, o2, 1e-5, 1e-5));
  EXPECT_TRUE(test::all_close(state_chunked, state_recurrent, 1e-5, 1e-5));
  auto w = torch::randn(o1.sizes());
  (o1 * w).sum().backward();
  (o2 * w).sum().backward();
  EXPECT_TRUE(test::all_close(q1.grad(), q2.grad(), 1e-5, 1e-5));
  EXPECT_TRUE(test::all_close(k1.grad(), k2.grad(), 1e-5, 1e-5));
  EXPECT_TRUE(test::all_close(v1.grad(), v2.grad(), 1e-5, 1e-5));
}

INSTANTIATE_TEST_SUITE_P(LinearAttention, ChunkSizes, ::testing::Values(1, 3, 7, 8, 24, 40));

// More chunks than one product takes (256): the state is carried from one group of chunks to the
// next, and into the shorter last chunk.
TEST(LinearAttention, ChunksBeyondOneGroupCarryTheirState) {
  auto in = random_qkv(1, 2, 521, 4, 3);
  auto q1 = in.q.clone().requires_grad_(), q2 = in.q.clone().requires_grad_();
  at::Tensor state_chunked, state_recurrent;
  auto o1 = lightning_attention_chunked(q1, in.k, in.v, in.decay, 2, {}, &state_chunked);  // 260 chunks + 1 token
  auto o2 = linear_attention_recurrent(q2, in.k, in.v, in.decay, {}, &state_recurrent);
  EXPECT_TRUE(test::all_close(o1, o2, 1e-5, 1e-5));
  EXPECT_TRUE(test::all_close(state_chunked, state_recurrent, 1e-5, 1e-5));
  o1.sum().backward();
  o2.sum().backward();
  EXPECT_TRUE(test::all_close(q1.grad(), q2.grad(), 1e-5, 1e-5));
}

TEST(LinearAttention, RecurrentMatchesDefinitionAtOnePosition) {
  auto in = random_qkv(1, 2, 6, 3, 4);
  auto o = linear_attention_recurrent(in.q, in.k, in.v, in.decay);
  const int64_t h = 1, i = 5;
  auto expected = torch::zeros({4});
  const double lambda = in.decay[h].item<double>();
  for (int64_t j = 0; j <= i; ++j)
    expected += std::pow(lambda, static_cast<double>(i - j)) * (in.q[0][h][i] * in.k[0][h][j]).sum() * in.v[0][h][j];
  EXPECT_TRUE(test::all_close(o[0][h][i], expected, 1e-5, 1e-6));
}

TEST(LinearAttention, SplitSequenceWithCarriedStateEqualsWhole) {
  auto in = random_qkv(2, 4, 30, 8, 8);
  at::Tensor whole_state;
  auto whole = lightning_attention_chunked(in.q, in.k, in.v, in.decay, 8, {}, &whole_state);
  for (int64_t cut : {1, 13, 16, 29}) {
    at::Tensor mid, end;
    auto first = lightning_attention_chunked(in.q.narrow(2, 0, cut), in.k.narrow(2, 0, cut), in.v.narrow(2, 0, cut),
                                             in.decay, 8, {}, &mid);
    const int64_t rest = 30 - cut;
    auto second = lightning_attention_chunked(in.q.narrow(2, cut, rest), in.k.narrow(2, cut, rest),
                                              in.v.narrow(2, cut, rest), in.decay, 8, mid, &end);
    EXPECT_TRUE(test::all_close(at::cat({first, second}, 2), whole, 1e-5, 1e-5)) << "cut " << cut;
    EXPECT_TRUE(test::all_close(end, whole_state, 1e-5, 1e-5)) << "cut " << cut;
    at::Tensor rec_end;
    auto rec = linear_attention_recurrent(in.q.narrow(2, cut, rest), in.k.narrow(2, cut, rest),
                                          in.v.narrow(2, cut, rest), in.decay, mid, &rec_end);
    EXPECT_TRUE(test::all_close(rec, second, 1e-5, 1e-5)) << "cut " << cut;
  }
}

TEST(LinearAttention, GradientFlowsIntoInitialState) {
  auto in = random_qkv(1, 2, 10, 4, 4);
  auto s1 = torch::randn({1, 2, 4, 4}).requires_grad_();
  auto s2 = s1.detach().clone().requires_grad_();
  lightning_attention_chunked(in.q, in.k, in.v, in.decay, 4, s1).sum().backward();
  linear_attention_recurrent(in.q, in.k, in.v, in.decay, s2).sum().backward();
  EXPECT_TRUE(test::all_close(s1.grad(), s2.grad(), 1e-5, 1e-5));
}

TEST(LinearAttention, LongSequencesStayFinite) {
  // λ^T underflows to zero for T = 4096 and the largest slope; no division by λ^i may occur.
  auto in = random_qkv(1, 4, 4096, 4, 4);
  auto o = lightning_attention_chunked(in.q, in.k, in.v, in.decay, 256);
  EXPECT_TRUE(torch::isfinite(o).all().item<bool>());
}

TEST(LinearAttention, AlibiSlopes) {
  auto s4 = alibi_slopes(4);
  EXPECT_TRUE(test::all_close(s4, torch::tensor({0.25f, 0.0625f, 0.015625f, 0.00390625f}), 0, 1e-9));
  // H = 6: the 4 slopes of H = 4, then slopes 0, 2 of H = 8 (2^-1, 2^-3).
  auto s6 = alibi_slopes(6);
  EXPECT_TRUE(test::all_close(s6, torch::tensor({0.25f, 0.0625f, 0.015625f, 0.00390625f, 0.5f, 0.125f}), 0, 1e-9));
}

}  // namespace
}  // namespace tessera
