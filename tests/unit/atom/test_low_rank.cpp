// Low-rank pseudo-gradients for the swarm's DiLoCo rounds (atom/low_rank.h): which tensors are
// compressed and how many entries a round carries, factors with orthonormal columns that a
// rank-deficient mean cannot break, the two sides of the power iteration (a mean of rank r is
// delivered exactly by the second round), and error feedback that loses nothing over the rounds.
#include <gtest/gtest.h>

#include <vector>

#include <torch/types.h>
#include <torch/utils.h>

#include "atom/low_rank.h"

namespace tessera::atom {
namespace {

// [8, 32] is compressed at rank 2 (2 x 40 < 256); [32] and [2, 3] (2 x 5 > 6) travel whole.
const std::vector<std::vector<int64_t>> kShapes = {{8, 32}, {32}, {2, 3}};

at::Tensor left(const at::Tensor& factors) { return factors.narrow(0, 0, 16).view({8, 2}); }
at::Tensor right(const at::Tensor& factors) { return factors.narrow(0, 16, 64).view({32, 2}); }

void expect_orthonormal(const at::Tensor& x) {
  EXPECT_TRUE(at::isfinite(x).all().item<bool>());
  EXPECT_TRUE(at::allclose(at::mm(x.t(), x), at::eye(x.size(1)), 1e-5, 1e-5)) << x;
}

TEST(LowRankPseudoGradients, CompressesTheMatricesItSavesBytesOn) {
  const LowRankPseudoGradients codec(kShapes, 2);
  EXPECT_EQ(codec.compressed_matrices(), 1);
  EXPECT_EQ(codec.full_numel(), 256 + 32 + 6);
  EXPECT_EQ(codec.factors_numel(), (8 + 32) * 2);
  EXPECT_EQ(codec.numel(0), 8 * 2 + 32 + 6);   // M R: [8, 2]
  EXPECT_EQ(codec.numel(1), 32 * 2 + 32 + 6);  // M^T L: [32, 2]
  const at::Tensor factors = codec.initial_factors();
  expect_orthonormal(left(factors));
  expect_orthonormal(right(factors));
  EXPECT_TRUE(at::equal(factors, LowRankPseudoGradients(kShapes, 2).initial_factors()));  // the same on every peer
  // A zero mean (nothing learnt) leaves orthonormal factors, not NaNs.
  at::Tensor f = factors.clone();
  codec.advance(f, at::zeros({codec.numel(0)}), 0);
  codec.advance(f, at::zeros({codec.numel(1)}), 1);
  expect_orthonormal(left(f));
  expect_orthonormal(right(f));
}

TEST(LowRankPseudoGradients, TwoRoundsDeliverAMeanOfRankR) {
  torch::manual_seed(1);
  const LowRankPseudoGradients codec(kShapes, 2);
  at::Tensor factors = codec.initial_factors();
  // Three peers whose matrices share a column space of rank 2: their mean has rank 2.
  const at::Tensor u = torch::randn({8, 2});
  std::vector<at::Tensor> peers;
  for (int i = 0; i < 3; ++i)
    peers.push_back(at::cat({at::mm(u, torch::randn({2, 32})).reshape(-1), torch::randn({32 + 6})}));
  const at::Tensor mean = (peers[0] + peers[1] + peers[2]) / 3;
  for (int64_t round : {0, 1}) {
    at::Tensor sum = at::zeros({codec.numel(round)});
    for (const at::Tensor& p : peers) sum += codec.encode(p, factors, round);
    const at::Tensor got = codec.decode(sum / 3, factors, round);
    // The whole tensors are the mean itself.
    EXPECT_TRUE(at::allclose(got.narrow(0, 256, 38), mean.narrow(0, 256, 38), 1e-6, 1e-6));
    const at::Tensor m = mean.narrow(0, 0, 256).view({8, 32}), g = got.narrow(0, 0, 256).view({8, 32});
    if (round == 0) {
      // The mean projected on R's span.
      EXPECT_TRUE(at::allclose(g, at::mm(at::mm(m, right(factors)), right(factors).t()), 1e-5, 1e-5));
      EXPECT_FALSE(at::allclose(g, m, 1e-3, 1e-3));
    } else {
      // L spans the mean's columns now: the estimate is the mean.
      EXPECT_TRUE(at::allclose(g, m, 1e-4, 1e-4)) << (g - m).abs().max();
    }
    codec.advance(factors, sum / 3, round);
    expect_orthonormal(left(factors));
    expect_orthonormal(right(factors));
  }
}

TEST(LowRankPseudoGradients, ErrorFeedbackLosesNothingOverTheRounds) {
  // Full-rank pseudo-gradients from three peers over six rounds: what the rounds applied plus the
  // peers' mean residual is what they computed, to float32 rounding.
  torch::manual_seed(2);
  const LowRankPseudoGradients codec(kShapes, 2);
  at::Tensor factors = codec.initial_factors();
  std::vector<at::Tensor> residual(3, at::zeros({codec.full_numel()}));
  at::Tensor applied = at::zeros({codec.full_numel()}), computed = at::zeros({codec.full_numel()});
  for (int64_t round = 0; round < 6; ++round) {
    at::Tensor sum = at::zeros({codec.numel(round)});
    std::vector<at::Tensor> sent;
    for (int i = 0; i < 3; ++i) {
      const at::Tensor g = torch::randn({codec.full_numel()});
      computed += g / 3;
      const at::Tensor with_residual = g + residual[i];
      sent.push_back(codec.encode(with_residual, factors, round));
      residual[i] = with_residual - codec.decode(sent.back(), factors, round);
      sum += sent.back();
    }
    applied += codec.decode(sum / 3, factors, round);
    codec.advance(factors, sum / 3, round);
  }
  const at::Tensor mean_residual = (residual[0] + residual[1] + residual[2]) / 3;
  EXPECT_TRUE(at::allclose(applied + mean_residual, computed, 1e-4, 1e-4))
      << (applied + mean_residual - computed).abs().max();
  EXPECT_GT(mean_residual.abs().max().item<double>(), 0.1);  // the projection did leave something
}

}  // namespace
}  // namespace tessera::atom
