// LowRankPseudoGradients: PowerSGD (Vogels, Karimireddy, Jaggi, NeurIPS 2019) for the swarm's
// DiLoCo rounds (swarm.pseudo_gradient_rank = r > 0), with its power iteration spread over the
// rounds so that each round stays one reduction of one vector (atom/averaging.h) and a round that
// fails changes nothing.
//
// Each parameter with dim >= 2 is viewed as M [n, m] = [size(0), numel / size(0)]; with
// r' = min(n, m, r) it is compressed when r' (n + m) < n m, else (vectors, tiny matrices) it
// travels whole. Every peer holds the same factors, two per compressed matrix: L [n, r'] and
// R [m, r'], each with orthonormal columns. They start as the orthonormalised randn of a generator
// seeded with the matrix's position (the same on every peer) and change only from a round's mean,
// which every member of the round receives bit for bit; they travel in the state a joiner takes and
// in a peer's checkpoint. Round s (the swarm step) alternates the side:
//   s even  a peer contributes M R [n, r']; the mean estimate is mean(M R) R^T = mean(M) R R^T (the
//           mean projected on R's span); then L <- orth(mean(M R));
//   s odd   it contributes M^T L [m, r']; the estimate is L mean(M^T L)^T = L L^T mean(M); then
//           R <- orth(mean(M^T L)).
// Two rounds make one step of PowerSGD's warm-started power iteration (P = M Q, then Q = M^T P),
// each half in a round of its own. A contribution is, in parameter order, each whole tensor
// flattened or each compressed matrix's product.
//
// Error feedback is the caller's and is required (the projection drops what lies outside the
// factors' span): residual = pseudo-gradient - decode(what the round counted of this peer's
// contribution), which joins the next pseudo-gradient (swarm.h).
//
// Determinism: what every member computes from the round's mean (decode, advance) runs as plain
// loops in double precision in a fixed order, not through a BLAS whose kernels differ between
// machines, so peers on different hosts (one build, one architecture: the x86-64 baseline has no
// fused multiply-add for the compiler to contract into) keep equal factors and apply equal outer
// steps.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

namespace tessera::atom {

class LowRankPseudoGradients {
 public:
  // `shapes`: the model's parameters in order (the flat pseudo-gradient is their concatenation).
  LowRankPseudoGradients(const std::vector<std::vector<int64_t>>& shapes, int64_t rank);

  // The factors' first values: [factors_numel()] float32, each compressed matrix's L [n, r'] then
  // R [m, r'] (row-major), in parameter order.
  at::Tensor initial_factors() const;
  int64_t factors_numel() const { return factors_numel_; }
  // Entries of the flat pseudo-gradient, and of a contribution to round `round`.
  int64_t full_numel() const { return full_numel_; }
  int64_t numel(int64_t round) const;
  int64_t compressed_matrices() const;

  at::Tensor encode(const at::Tensor& flat, const at::Tensor& factors, int64_t round) const;
  // A contribution of round `round` (or the mean of the round's) back to a flat [full_numel()].
  at::Tensor decode(const at::Tensor& contribution, const at::Tensor& factors, int64_t round) const;
  // The factors after round `round`, whose mean contribution was `mean` (the side just reduced).
  void advance(at::Tensor& factors, const at::Tensor& mean, int64_t round) const;

 private:
  struct Entry {
    int64_t offset = 0, numel = 0;  // in the flat pseudo-gradient
    int64_t n = 0, m = 0, rank = 0;  // rank 0: travels whole
    int64_t factors = 0;             // offset of its L, then R at + n rank
  };
  std::vector<Entry> entries_;
  int64_t full_numel_ = 0, factors_numel_ = 0;
};

}  // namespace tessera::atom
