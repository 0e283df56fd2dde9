// AutocastGuard: a scoped autocast region for C++, which libtorch does not provide
// (libtorch-notes §5). It mirrors torch.amp.autocast's __enter__/__exit__
// (torch/amp/autocast_mode.py):
//
//   enter: save enabled(device), dtype(device), cache_enabled; set enabled and dtype;
//          increment_nesting()
//   exit:  if decrement_nesting() == 0: clear_cache(); restore the three saved values
//
// so guards nest, an inner guard with enabled = false turns autocast off for its scope, and the
// cast-weight cache is dropped when the outermost region ends. The autocast state is
// thread-local; the autograd engine carries it to its worker threads. Run backward outside.
//
// Autocast's cast-weight cache: autocast casts a float32 leaf that requires grad (a parameter, not
// a view of one) to its lower-precision dtype once and hands the same copy to every product that
// asks for it until the outermost region ends. AutocastCacheScope raises the nesting for its own
// scope (autocast stays on or off as it is), so what autocast caches inside it is dropped when it
// ends: activation checkpointing's recomputation, which runs in the backward outside any region,
// holds one (memory/activation_checkpointing.h).
//
// WeightCastCache: while one lives on a thread, cast_weight() there hands out one copy of each
// weight for as long as anything keeps that copy's storage: every product that asks gets it, and
// a product's backward keeps it, so a pipeline step that holds one around its schedule
// (parallel/pipeline_step.h) keeps one bf16 copy of each weight for all the micro-batches it holds,
// where each forward made its own. The cache keeps no copy alive itself (a copy goes when the last
// backward that saved it has run, as without the cache), and hands out a copy only while its
// weight is the same tensor at the same version: an in-place change (the optimizer's step, a
// gather into it) makes the next call cast again. The copy is shared, the autograd node is not:
// each call in grad mode records its own cast node, whose backward casts the gradient to float32
// as a cast's does, so a micro-batch's weight gradients reach their accumulators as soon as their
// products' backward has run (one node shared by the micro-batches would be numbered in the
// first one's forward and run last in every backward, holding the 16-bit gradients of the whole
// stage until the backward's end). Under no-grad (a checkpointed segment's forward, a custom
// function's forward) the copy comes without a node. Scopes nest: an inner one shares the outer's.
//
// cast_weight(weight, dtype): the weight in `dtype`: the weight itself where it is in `dtype`;
// under a WeightCastCache the cache's copy of a float32 leaf requiring grad; otherwise a plain cast.
// linear() and the experts cast their weights with it (autocast then finds them cast already).
#pragma once

#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

namespace tessera {

class AutocastGuard {
 public:
  AutocastGuard(at::DeviceType device_type, at::ScalarType dtype, bool enabled = true);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  at::DeviceType device_type_;
  bool prev_enabled_;
  at::ScalarType prev_dtype_;
  bool prev_cache_enabled_;
};

class AutocastCacheScope {
 public:
  AutocastCacheScope();
  ~AutocastCacheScope();
  AutocastCacheScope(const AutocastCacheScope&) = delete;
  AutocastCacheScope& operator=(const AutocastCacheScope&) = delete;
};

class WeightCastCache {
 public:
  WeightCastCache();
  ~WeightCastCache();
  WeightCastCache(const WeightCastCache&) = delete;
  WeightCastCache& operator=(const WeightCastCache&) = delete;

 private:
  bool outermost_;
};

at::Tensor cast_weight(const at::Tensor& weight, at::ScalarType dtype);
// Weights joined along dim 0 in `dtype` (one operand for several products: the query and key/value
// projections' GEMM): under a WeightCastCache one copy of the join, kept and handed out as
// cast_weight's, its node's backward splitting the gradient into the weights' rows; otherwise
// the weights concatenated (and cast when `dtype` is not theirs).
at::Tensor cast_joined(at::TensorList weights, at::ScalarType dtype);
// Several weights (or biases) as one operand along dim 0, and back: each part's rows, their join
// (the part itself when alone), and a gradient of the join split into the parts' rows.
std::vector<int64_t> row_counts(at::TensorList parts);
at::Tensor join_rows(at::TensorList parts);
std::vector<at::Tensor> split_rows(const at::Tensor& joined, const std::vector<int64_t>& rows);
// autocast's dtype on `device` where autocast is on there, `otherwise` where it is off.
at::ScalarType autocast_dtype_or(c10::DeviceType device, at::ScalarType otherwise);

}  // namespace tessera
