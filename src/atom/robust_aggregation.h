// Robust aggregation: how the owner of a part of a round (atom/averaging.h) combines the members'
// contributions to it (swarm.aggregation), so that one member holding the key but sending poison
// (gradients x 1000, the sign flipped, noise, a stale contribution) cannot move the others'
// parameters at will.
//
// A member's contribution is a weighted sum v_i = w_i x_i: in batch mode its gradients summed
// over its samples, w_i its samples; under DiLoCo its pseudo-gradient, w_i = 1. Every rule returns
// sum = W r with W = the weights summed, so a member's sum / weight is the rule's estimate r of the
// members' mean x, and the caller divides as with the plain mean:
//   mean           r = the weighted mean. The contributions are summed as they arrive and none is
//                  kept (the round's result is bit for bit what it was before the rules existed).
//   centered_clip  CenteredClip (Karimireddy, He and Jaggi 2021; BTARD applies it at each part's
//                  owner, as here): r starts at the entry-wise median of the x_i; with
//                  tau = clip_radius x the median of the members' distances ||x_i - r||, up to
//                  kClipIterations times r <- r + sum_i w_i c_i (x_i - r) / W, c_i = min(1, tau / ||x_i - r||),
//                  stopping once a step moves r by less than 1e-7 of its norm. A member's `kept` is
//                  its c_i in the last step. tau scales with the honest members' spread (they are
//                  the majority), so a contribution a thousand times too large keeps ~1/1000 of its
//                  excess, and honest ones, whose distances differ by little, are not clipped.
//   trimmed_mean   entry by entry, the b largest and b smallest x_i are dropped and the rest
//                  averaged by weight; b = max(1, floor(trim_fraction x n)), at most (n - 1) / 2,
//                  and 0 for n <= 2. `kept`: the fraction of a member's entries not dropped.
//   median         trimmed_mean with b = floor((n - 1) / 2): the entry-wise median (for even n the
//                  weighted mean of the middle two).
// Members of weight 0 (nothing accumulated) contribute nothing under every rule. With n <= 2 no
// rule can tell the poisoned member from the honest one: the robust rules then equal the mean
// (centered_clip's two distances to their median are equal, so neither is clipped).
//
// Outliers. A member is an outlier of a part when centered_clip clipped it (kept < 1), or when
// trimmed_mean or median dropped more of its entries than chance drops an honest member's: kept
// below half of 1 - 2b/n. Owners report each member's kept and outlier flag with the sum
// (messages.h, SUM), so every member of the round learns them for every part (swarm.h logs them
// and names a member that is an outlier in most rounds).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace tessera::atom {

enum class Aggregation : uint8_t { mean, centered_clip, trimmed_mean, median };
Aggregation aggregation_from_name(const std::string& name);  // throws naming swarm.aggregation
const char* aggregation_name(Aggregation rule);

constexpr int64_t kClipIterations = 10;

struct AggregationRule {
  Aggregation kind = Aggregation::mean;
  double clip_radius = 2;      // centered_clip: tau over the median distance
  double trim_fraction = 0.25;  // trimmed_mean: the share of members dropped at each end
  // Members dropped at each end of an entry's sorted values, for n members of nonzero weight.
  int64_t trimmed(int64_t n) const;
};

// How one member's contribution to one part fared.
struct Screening {
  std::string member;
  double kept = 1;  // centered_clip: its clip factor; trimmed_mean, median: the fraction of entries kept
  bool outlier = false;
};

// One part's contributions, combined by the owner's rule as they arrive (mean) or once all are
// in (the others).
class PartAggregator {
 public:
  PartAggregator(AggregationRule rule, int64_t numel);
  // `values`: v_i = w_i x_i, float32 [numel].
  void add(const std::string& member, const at::Tensor& values, double weight);
  const AggregationRule& rule() const { return rule_; }
  int64_t numel() const { return numel_; }
  double weight() const { return weight_; }
  // The rule's sum (W r) and, for every rule but mean, each member's screening in the order added.
  // Called once, after the last add().
  at::Tensor finish(std::vector<Screening>& screened);

 private:
  AggregationRule rule_;
  int64_t numel_;
  at::Tensor sum_;  // mean: the running sum
  std::vector<std::string> members_;
  std::vector<at::Tensor> values_;  // the other rules: each member's x_i (v_i / w_i)
  std::vector<double> weights_;
  double weight_ = 0;
};

}  // namespace tessera::atom
