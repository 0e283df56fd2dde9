// Robust aggregation at the owner of a part (robust_aggregation.h).
#include "atom/robust_aggregation.h"

#include <algorithm>

#include <ATen/ATen.h>

#include "core/error.h"

namespace tessera::atom {
namespace {

// The entry-wise median of the rows of `x` [n, P]; for even n the mean of the middle two rows.
at::Tensor entry_median(const at::Tensor& x) {
  const int64_t n = x.size(0);
  const at::Tensor sorted = std::get<0>(x.sort(0));
  if (n % 2 == 1) return sorted[n / 2].clone();
  return (sorted[n / 2 - 1] + sorted[n / 2]) / 2;
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// CenteredClip over the rows of `x` [n, P] with weights `w` [n]: the estimate and each row's last
// clip factor.
at::Tensor centered_clip(const at::Tensor& x, const at::Tensor& w, double radius, std::vector<double>& factors) {
  const int64_t n = x.size(0);
  at::Tensor r = entry_median(x);
  const at::Tensor start = (x - r).norm(2, {1});
  const double tau = radius * median_of(std::vector<double>(start.data_ptr<float>(), start.data_ptr<float>() + n));
  const double total = w.sum().item<double>();
  at::Tensor c = at::ones({n}, at::kFloat);
  for (int64_t it = 0; it < kClipIterations; ++it) {
    const at::Tensor d = x - r;
    const at::Tensor norms = d.norm(2, {1});
    // A row at r, or every row within a zero radius of it, is not moved (and kept whole).
    c = at::where(norms > tau, at::full({n}, tau, at::kFloat) / norms.clamp_min(1e-30), at::ones({n}, at::kFloat));
    const at::Tensor step = ((w * c).unsqueeze(1) * d).sum(0) / total;
    r.add_(step);
    if (step.norm().item<double>() <= 1e-7 * r.norm().item<double>()) break;
  }
  factors.assign(c.data_ptr<float>(), c.data_ptr<float>() + n);
  return r;
}

// The weighted mean of each entry's values with the b largest and b smallest dropped, and the
// fraction of each row's entries kept.
at::Tensor trimmed_mean(const at::Tensor& x, const at::Tensor& w, int64_t b, std::vector<double>& kept) {
  const int64_t n = x.size(0), p = x.size(1);
  const auto [sorted, order] = x.sort(0);
  const at::Tensor middle = sorted.slice(0, b, n - b), rows = order.slice(0, b, n - b);
  const at::Tensor weights = w.index({rows});  // [n - 2b, P]
  const at::Tensor r = (middle * weights).sum(0) / weights.sum(0);
  const at::Tensor counts = at::bincount(rows.reshape({-1}), {}, n).to(at::kDouble) / static_cast<double>(p);
  kept.assign(counts.data_ptr<double>(), counts.data_ptr<double>() + n);
  return r;
}

}  // namespace

Aggregation aggregation_from_name(const std::string& name) {
  if (name == "mean") return Aggregation::mean;
  if (name == "centered_clip") return Aggregation::centered_clip;
  if (name == "trimmed_mean") return Aggregation::trimmed_mean;
  if (name == "median") return Aggregation::median;
  throw Error("swarm.aggregation must be mean, centered_clip, trimmed_mean or median (got '" + name + "')");
}

const char* aggregation_name(Aggregation rule) {
  switch (rule) {
    case Aggregation::mean: return "mean";
    case Aggregation::centered_clip: return "centered_clip";
    case Aggregation::trimmed_mean: return "trimmed_mean";
    case Aggregation::median: return "median";
  }
  return "?";
}

int64_t AggregationRule::trimmed(int64_t n) const {
  if (n <= 2) return 0;
  const int64_t most = (n - 1) / 2;
  if (kind == Aggregation::median) return most;
  return std::min(most, std::max<int64_t>(1, static_cast<int64_t>(trim_fraction * static_cast<double>(n))));
}

PartAggregator::PartAggregator(AggregationRule rule, int64_t numel) : rule_(rule), numel_(numel) {
  if (rule_.kind == Aggregation::mean) sum_ = at::zeros({numel}, at::kFloat);
}

void PartAggregator::add(const std::string& member, const at::Tensor& values, double weight) {
  weight_ += weight;
  if (rule_.kind == Aggregation::mean) {
    sum_.add_(values);
    return;
  }
  members_.push_back(member);
  weights_.push_back(weight);
  values_.push_back(weight > 0 ? values / weight : at::Tensor());
}

at::Tensor PartAggregator::finish(std::vector<Screening>& screened) {
  screened.clear();
  if (rule_.kind == Aggregation::mean) return sum_;
  std::vector<at::Tensor> rows;
  std::vector<float> weights;
  std::vector<size_t> of_row;  // the member of each row
  for (size_t i = 0; i < members_.size(); ++i) {
    screened.push_back({members_[i], 1.0, false});
    if (weights_[i] <= 0) continue;
    rows.push_back(values_[i]);
    weights.push_back(static_cast<float>(weights_[i]));
    of_row.push_back(i);
  }
  const int64_t n = static_cast<int64_t>(rows.size());
  if (n == 0 || numel_ == 0) return at::zeros({numel_}, at::kFloat);
  const at::Tensor x = at::stack(rows), w = at::tensor(weights, at::kFloat);
  std::vector<double> kept;
  at::Tensor r;
  double floor = 1;  // below it a member is an outlier
  if (rule_.kind == Aggregation::centered_clip) {
    r = centered_clip(x, w, rule_.clip_radius, kept);
  } else {
    const int64_t b = rule_.trimmed(n);
    r = trimmed_mean(x, w, b, kept);
    floor = 0.5 * (1.0 - 2.0 * static_cast<double>(b) / static_cast<double>(n));
  }
  for (int64_t k = 0; k < n; ++k) {
    Screening& s = screened[of_row[static_cast<size_t>(k)]];
    s.kept = kept[static_cast<size_t>(k)];
    s.outlier = s.kept < floor;
  }
  return r * weight_;
}

}  // namespace tessera::atom
