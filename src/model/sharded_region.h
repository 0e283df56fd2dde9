// The hook through which tensor parallelism, applied from outside (parallel/tensor/tensor_parallel.h),
// splits a block's attention or MLP Megatron-style. The model never communicates: a layer calls
// the region's functions where the split computation needs the other ranks, and a layer without
// a region computes on one device exactly as before.
//
// A region is a column-parallel input projection (or several), a local function of its output,
// and a row-parallel output projection:
//   without a region:  y = out_proj(f(in_proj(x)))                   bias inside out_proj's GEMM
//   with a region:     y = exit(f(in_proj(enter(x))) W_out^T) + b_out
// where in_proj holds this rank's output columns (heads, hidden units), W_out this rank's input
// columns, and b_out, replicated, is added once after exit has summed the ranks' partial products
// (in the product's dtype, as the GEMM would under autocast).
//   enter: [B, T', C] -> [B, T, C]    copy_to_tp (T' = T), or gather_from_sequence (T' = T/N)
//   exit:  [B, T, C] partial -> [B, T', C] reduced   reduce_from_tp, or reduce_scatter_to_sequence
// Both members are set together. A layer whose region input feeds one projection applies it with
// project(), which uses `column` where the region sets it: the input projection entered in one
// function (under Megatron-SP, sequence_gathered_linear, which keeps this rank's [B, T/N, C] for the
// backward instead of the gathered [B, T, C]); without it, linear(enter(x)). A layer that feeds the
// region's input to several projections (lightning attention's four) calls input() once.
#pragma once

#include <functional>

#include <ATen/core/Tensor.h>

#include "model/linear.h"

namespace tessera {

struct ShardedRegion {
  using Map = std::function<at::Tensor(const at::Tensor&)>;
  // x, the projections' weights and their biases (one per weight, or none).
  using Column = std::function<at::Tensor(const at::Tensor& x, at::TensorList weights, at::TensorList biases)>;
  Map enter;
  Map exit;
  Column column;  // optional: enter and the projection in one

  bool active() const { return static_cast<bool>(enter); }
  explicit operator bool() const { return active(); }

  // The input of the region's column-parallel projections.
  at::Tensor input(const at::Tensor& x) const { return active() ? enter(x) : x; }

  // The column-parallel input projection of x [B, T', in]: [B, T, out / N].
  at::Tensor project(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) const {
    if (!column) return linear(input(x), weight, bias);
    return bias.defined() ? column(x, {weight}, {bias}) : column(x, {weight}, {});
  }
  at::Tensor project(const Linear& proj, const at::Tensor& x) const { return project(x, proj->weight, proj->bias); }
  // Several column-parallel projections of x as one product of their weights joined (linear_joined).
  at::Tensor project_joined(const at::Tensor& x, at::TensorList weights, at::TensorList biases) const {
    return column ? column(x, weights, biases) : linear_joined(input(x), weights, biases);
  }

  // The row-parallel output projection of y [B, T, in]: [B, T', out].
  at::Tensor output(const Linear& proj, const at::Tensor& y) const {
    if (!active()) return linear(proj, y);
    at::Tensor out = exit(linear(y, proj->weight, at::Tensor()));
    return proj->bias.defined() ? out + proj->bias.to(out.scalar_type()) : out;
  }
};

}  // namespace tessera
