// PowerSGD's power iteration over the swarm's rounds (low_rank.h).
#include "atom/low_rank.h"

#include <algorithm>
#include <cmath>

#include <ATen/ATen.h>

#include "core/error.h"
#include "core/splitmix.h"

namespace tessera::atom {
namespace {

// x [rows, cols] (row-major, double, cols < rows) to orthonormal columns spanning it, by modified
// Gram-Schmidt in a fixed order. A column with nothing left after the projections (a rank-deficient
// mean, a zero pseudo-gradient) becomes the unit vector e_k least in the span of those before it
// (some e_k lies partly outside it, as cols < rows), so the result always has orthonormal columns
// and never a NaN.
void orthonormalise(std::vector<double>& x, int64_t rows, int64_t cols) {
  auto el = [&](int64_t i, int64_t j) -> double& { return x[static_cast<size_t>(i * cols + j)]; };
  auto project_out = [&](int64_t j) {
    for (int64_t k = 0; k < j; ++k) {
      double dot = 0;
      for (int64_t i = 0; i < rows; ++i) dot += el(i, k) * el(i, j);
      for (int64_t i = 0; i < rows; ++i) el(i, j) -= dot * el(i, k);
    }
  };
  auto norm = [&](int64_t j) {
    double s = 0;
    for (int64_t i = 0; i < rows; ++i) s += el(i, j) * el(i, j);
    return std::sqrt(s);
  };
  for (int64_t j = 0; j < cols; ++j) {
    const double before = norm(j);
    project_out(j);
    double after = norm(j);
    if (before == 0 || after <= 1e-12 * before) {
      // |e_k - its projection|^2 = 1 - sum over earlier columns of their k-th entry squared.
      int64_t best = 0;
      double most = -1;
      for (int64_t k = 0; k < rows; ++k) {
        double left = 1;
        for (int64_t c = 0; c < j; ++c) left -= el(k, c) * el(k, c);
        if (left > most) most = left, best = k;
      }
      for (int64_t i = 0; i < rows; ++i) el(i, j) = i == best ? 1.0 : 0.0;
      project_out(j);
      after = norm(j);
    }
    for (int64_t i = 0; i < rows; ++i) el(i, j) /= after;
  }
}

}  // namespace

LowRankPseudoGradients::LowRankPseudoGradients(const std::vector<std::vector<int64_t>>& shapes, int64_t rank) {
  require(rank > 0, "internal: a low-rank pseudo-gradient needs a rank above 0");
  for (const std::vector<int64_t>& shape : shapes) {
    Entry e;
    e.offset = full_numel_;
    e.numel = 1;
    for (int64_t d : shape) e.numel *= d;
    if (shape.size() >= 2 && e.numel > 0) {
      const int64_t n = shape[0], m = e.numel / n, r = std::min({n, m, rank});
      if (r * (n + m) < n * m) {
        e.n = n;
        e.m = m;
        e.rank = r;
        e.factors = factors_numel_;
        factors_numel_ += (n + m) * r;
      }
    }
    full_numel_ += e.numel;
    entries_.push_back(e);
  }
}

int64_t LowRankPseudoGradients::numel(int64_t round) const {
  int64_t out = 0;
  for (const Entry& e : entries_) out += e.rank == 0 ? e.numel : (round % 2 == 0 ? e.n : e.m) * e.rank;
  return out;
}

int64_t LowRankPseudoGradients::compressed_matrices() const {
  return std::count_if(entries_.begin(), entries_.end(), [](const Entry& e) { return e.rank > 0; });
}

at::Tensor LowRankPseudoGradients::initial_factors() const {
  at::Tensor out = at::empty({factors_numel_}, at::kFloat);
  float* f = out.data_ptr<float>();
  for (size_t i = 0; i < entries_.size(); ++i) {
    const Entry& e = entries_[i];
    if (e.rank == 0) continue;
    // L and R from uniform values in [-1, 1) of splitmix64 seeded by the parameter's position.
    uint64_t state = splitmix64(0x10a7a4e5ULL ^ i);
    for (const auto& [offset, rows] : {std::pair{e.factors, e.n}, std::pair{e.factors + e.n * e.rank, e.m}}) {
      std::vector<double> x(static_cast<size_t>(rows * e.rank));
      for (double& v : x) {
        state = splitmix64(state);
        v = static_cast<double>(state >> 11) * 0x1.0p-52 - 1.0;
      }
      orthonormalise(x, rows, e.rank);
      std::copy(x.begin(), x.end(), f + offset);
    }
  }
  return out;
}

at::Tensor LowRankPseudoGradients::encode(const at::Tensor& flat, const at::Tensor& factors, int64_t round) const {
  require(flat.numel() == full_numel_ && factors.numel() == factors_numel_,
          "internal: a low-rank pseudo-gradient of the wrong size");
  std::vector<at::Tensor> parts;
  for (const Entry& e : entries_) {
    const at::Tensor t = flat.narrow(0, e.offset, e.numel);
    if (e.rank == 0) {
      parts.push_back(t);
    } else if (round % 2 == 0) {
      const at::Tensor right = factors.narrow(0, e.factors + e.n * e.rank, e.m * e.rank).view({e.m, e.rank});
      parts.push_back(at::mm(t.view({e.n, e.m}), right).reshape(-1));
    } else {
      const at::Tensor left = factors.narrow(0, e.factors, e.n * e.rank).view({e.n, e.rank});
      parts.push_back(at::mm(t.view({e.n, e.m}).t(), left).reshape(-1));
    }
  }
  return at::cat(parts);
}

at::Tensor LowRankPseudoGradients::decode(const at::Tensor& contribution, const at::Tensor& factors,
                                          int64_t round) const {
  require(contribution.numel() == numel(round) && factors.numel() == factors_numel_,
          "internal: a low-rank contribution of the wrong size");
  const at::Tensor c = contribution.contiguous().to(at::kFloat), fs = factors.contiguous();
  at::Tensor out = at::empty({full_numel_}, at::kFloat);
  const float *in = c.data_ptr<float>(), *f = fs.data_ptr<float>();
  float* o = out.data_ptr<float>();
  int64_t pos = 0;
  for (const Entry& e : entries_) {
    float* dst = o + e.offset;
    if (e.rank == 0) {
      std::copy(in + pos, in + pos + e.numel, dst);
      pos += e.numel;
      continue;
    }
    // even: out = P R^T with P [n, r] the contribution; odd: out = L Q^T with Q [m, r] it. Each
    // entry sums its r products in k order from 0; the loop runs over a row at a time (b
    // transposed) so that the entries of a row, independent of each other, can share vector lanes.
    const bool even = round % 2 == 0;
    const float* a = even ? in + pos : f + e.factors;                 // [n, r]
    const float* b = even ? f + e.factors + e.n * e.rank : in + pos;  // [m, r]
    std::vector<double> bt(static_cast<size_t>(e.rank * e.m)), row(static_cast<size_t>(e.m));
    for (int64_t j = 0; j < e.m; ++j)
      for (int64_t k = 0; k < e.rank; ++k) bt[static_cast<size_t>(k * e.m + j)] = b[j * e.rank + k];
    for (int64_t i = 0; i < e.n; ++i) {
      std::fill(row.begin(), row.end(), 0.0);
      for (int64_t k = 0; k < e.rank; ++k) {
        const double aik = a[i * e.rank + k];
        const double* bk = bt.data() + k * e.m;
        for (int64_t j = 0; j < e.m; ++j) row[static_cast<size_t>(j)] += aik * bk[j];
      }
      for (int64_t j = 0; j < e.m; ++j) dst[i * e.m + j] = static_cast<float>(row[static_cast<size_t>(j)]);
    }
    pos += (even ? e.n : e.m) * e.rank;
  }
  return out;
}

void LowRankPseudoGradients::advance(at::Tensor& factors, const at::Tensor& mean, int64_t round) const {
  require(mean.numel() == numel(round) && factors.numel() == factors_numel_ && factors.is_contiguous(),
          "internal: a low-rank round mean of the wrong size");
  const at::Tensor c = mean.contiguous().to(at::kFloat);
  const float* in = c.data_ptr<float>();
  float* f = factors.data_ptr<float>();
  int64_t pos = 0;
  for (const Entry& e : entries_) {
    if (e.rank == 0) {
      pos += e.numel;
      continue;
    }
    // even: the mean of M R [n, r] becomes L; odd: the mean of M^T L [m, r] becomes R.
    const bool even = round % 2 == 0;
    const int64_t rows = even ? e.n : e.m;
    std::vector<double> x(in + pos, in + pos + rows * e.rank);
    orthonormalise(x, rows, e.rank);
    std::copy(x.begin(), x.end(), f + (even ? e.factors : e.factors + e.n * e.rank));
    pos += rows * e.rank;
  }
}

}  // namespace tessera::atom
