// The owner's rules (atom/robust_aggregation.h) on one part: without poison each robust rule stays
// near the weighted mean (centered_clip equals it), and under each poison of the issue (x 1000,
// the sign flipped, noise of the gradient's norm, a stale contribution) the robust rules stay near
// the honest members' mean and name the poisoned member, where the plain mean is carried away.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <torch/types.h>
#include <torch/utils.h>

#include "atom/robust_aggregation.h"

namespace tessera::atom {
namespace {

constexpr int64_t kNumel = 4096;

struct Members {
  std::vector<std::string> ids;
  std::vector<at::Tensor> means;  // x_i
  std::vector<double> weights;
};

// Honest members: the true gradient plus noise of `spread` per entry, weights 1, 2, 3, ...
Members honest(int64_t n, const at::Tensor& truth, double spread) {
  Members m;
  for (int64_t i = 0; i < n; ++i) {
    m.ids.push_back("h" + std::to_string(i));
    m.means.push_back(truth + spread * at::randn({kNumel}));
    m.weights.push_back(static_cast<double>(i + 1));
  }
  return m;
}

at::Tensor weighted_mean(const Members& m) {
  at::Tensor sum = at::zeros({kNumel});
  double w = 0;
  for (size_t i = 0; i < m.ids.size(); ++i) {
    sum += m.weights[i] * m.means[i];
    w += m.weights[i];
  }
  return sum / w;
}

// The rule's estimate r (sum / weight) and each member's screening.
at::Tensor combine(const Members& m, AggregationRule rule, std::vector<Screening>& screened) {
  PartAggregator part(rule, kNumel);
  for (size_t i = 0; i < m.ids.size(); ++i) part.add(m.ids[i], m.weights[i] * m.means[i], m.weights[i]);
  const at::Tensor sum = part.finish(screened);
  return sum / part.weight();
}

double distance(const at::Tensor& a, const at::Tensor& b) { return (a - b).norm().item<double>(); }

TEST(RobustAggregation, WithoutPoisonEachRuleStaysAtTheWeightedMean) {
  torch::manual_seed(1);
  const at::Tensor truth = at::randn({kNumel});
  const Members m = honest(5, truth, 0.3);
  const at::Tensor want = weighted_mean(m);
  const double spread = 0.3 * std::sqrt(static_cast<double>(kNumel));  // one member's distance from truth
  std::vector<Screening> screened;
  // centered_clip clips nobody, and its first step lands on the weighted mean.
  EXPECT_LT(distance(combine(m, {Aggregation::centered_clip}, screened), want), 1e-4 * spread);
  for (const Screening& s : screened) {
    EXPECT_EQ(s.kept, 1.0) << s.member;
    EXPECT_FALSE(s.outlier) << s.member;
  }
  // Trimming and the median drop honest values: near the mean, not on it; nobody is an outlier.
  for (Aggregation kind : {Aggregation::trimmed_mean, Aggregation::median}) {
    EXPECT_LT(distance(combine(m, {kind}, screened), want), 0.4 * spread) << aggregation_name(kind);
    for (const Screening& s : screened) EXPECT_FALSE(s.outlier) << aggregation_name(kind) << " " << s.member;
  }
  // mean: the contributions summed as they come, nothing screened.
  EXPECT_TRUE(at::allclose(combine(m, {Aggregation::mean}, screened), want, 1e-5, 1e-6));
  EXPECT_TRUE(screened.empty());
}

TEST(RobustAggregation, EachPoisonMovesTheMeanButNotTheRobustRules) {
  torch::manual_seed(2);
  const at::Tensor truth = at::randn({kNumel}), earlier = at::randn({kNumel});
  const double spread = 0.5 * std::sqrt(static_cast<double>(kNumel));
  for (const std::string poison : {"scale", "flip", "noise", "stale"}) {
    Members m = honest(3, truth, 0.5);
    const at::Tensor want = weighted_mean(m);
    const at::Tensor own = truth + 0.5 * at::randn({kNumel});
    m.ids.push_back("poisoned");
    m.weights.push_back(3);
    // Each poison magnified (x 10 past the issue's) so that it carries the plain mean far: the
    // robust rules' error is bounded whatever the poison's size.
    m.means.push_back(poison == "scale"  ? 1000 * own
                      : poison == "flip" ? -10 * own
                      : poison == "noise" ? at::randn({kNumel}) * (10 * own.norm() / std::sqrt(double(kNumel)))
                                          : 10 * earlier);
    std::vector<Screening> screened;
    const double plain = distance(combine(m, {Aggregation::mean}, screened), want);
    EXPECT_GT(plain, 4 * spread) << poison;
    for (Aggregation kind : {Aggregation::centered_clip, Aggregation::trimmed_mean, Aggregation::median}) {
      const double robust = distance(combine(m, {kind}, screened), want);
      // centered_clip: the clipped member pulls with its weight x tau (tau = 2 x an honest
      // member's distance, about `spread`), the honest weight 6 pulls back: at most 3/6 x 2
      // spread. Trimming replaces the poison by honest values.
      const double bound = kind == Aggregation::centered_clip ? 1.1 * spread : 0.6 * spread;
      EXPECT_LT(robust, bound) << poison << " " << aggregation_name(kind) << " (mean: " << plain << ")";
      for (const Screening& s : screened)
        EXPECT_EQ(s.outlier, s.member == "poisoned") << poison << " " << aggregation_name(kind) << " " << s.member
                                                     << " kept " << s.kept;
    }
  }
}

TEST(RobustAggregation, TrimCountsAndWeightlessMembers) {
  const AggregationRule trim{Aggregation::trimmed_mean, 2, 0.25}, median{Aggregation::median};
  EXPECT_EQ(trim.trimmed(2), 0);
  EXPECT_EQ(trim.trimmed(3), 1);
  EXPECT_EQ(trim.trimmed(4), 1);
  EXPECT_EQ(trim.trimmed(8), 2);
  EXPECT_EQ(trim.trimmed(9), 2);
  EXPECT_EQ(median.trimmed(4), 1);
  EXPECT_EQ(median.trimmed(9), 4);
  // A member of weight 0 contributes nothing, whatever it sends.
  for (Aggregation kind : {Aggregation::centered_clip, Aggregation::trimmed_mean, Aggregation::median}) {
    PartAggregator part({kind}, 4);
    part.add("a", at::full({4}, 2.0f), 1);
    part.add("b", at::full({4}, 2.0f), 1);
    part.add("zero", at::full({4}, 1e6f), 0);
    std::vector<Screening> screened;
    const at::Tensor sum = part.finish(screened);
    EXPECT_TRUE(at::allclose(sum, at::full({4}, 4.0f))) << aggregation_name(kind);
    ASSERT_EQ(screened.size(), 3u);
    EXPECT_FALSE(screened[2].outlier);
  }
  EXPECT_THROW(aggregation_from_name("krum"), Error);
}

}  // namespace
}  // namespace tessera::atom
