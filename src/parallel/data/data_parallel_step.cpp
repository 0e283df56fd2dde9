// DataParallel's clipping norm and optimizer step over this rank's slices, on the device or, with
// ZeRO-Offload, on the host (data_parallel.h).
#include "parallel/data/data_parallel.h"

#include <cmath>
#include <utility>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include "core/error.h"
#include "optim/clipping.h"
#include "parallel/data/data_parallel_impl.h"

namespace tessera {

double DataParallel::clip_grad_norm(double max_norm) {
  Impl& s = *impl_;
  at::NoGradGuard no_grad;
  if (s.offload) s.offload->wait();
  const at::Device device = s.params.front().second.device();
  // Scaled are the gradients the optimizer reads: with offload the host's.
  if (s.stage <= 1) {
    // The norm over the whole (all-reduced) device gradients, with or without offload.
    std::vector<at::Tensor> grads;
    double norm;
    if (s.groups.size() > 1) {
      // Each replica of a gradient counted 1/|its group| times over the data group, whose ranks
      // outside an expert group hold other experts.
      std::vector<int64_t> replicas;
      for (size_t g : s.group_of) replicas.push_back(s.group(g).size());
      norm = s.norm.grad_norm(s.params, grads, replicas, &s.dp);
    } else if (s.norm.split()) {
      norm = s.norm.grad_norm(s.params, grads);
    } else {
      std::vector<at::Tensor> tensors;
      for (const auto& [name, p] : s.params) tensors.push_back(p);
      if (!s.offload) return tessera::clip_grad_norm(tensors, max_norm);
      norm = tessera::clip_grad_norm(tensors, 0);
    }
    scale_to_max_norm(s.offload ? s.offload->grads() : grads, norm, max_norm);
    return norm;
  }
  // Every element of the gradient lives in exactly one rank's shards (the padding is zero).
  const std::vector<at::Tensor>& shards = s.offload ? s.offload->grads() : s.grad_shards;
  at::Tensor squares;
  if (!s.norm.split()) {
    squares = at::stack(at::_foreach_norm(shards, 2)).to(at::kDouble).pow(2).sum().reshape({1}).to(device);
  } else {  // each entry's owned part counted by its tensor-parallel weight
    std::vector<at::Tensor> parts;
    std::vector<double> weights;
    for (size_t u = 0; u < s.units.size(); ++u)
      for (const auto& e : s.units[u].entries()) {
        const auto [begin, end] = s.units[u].owned(e);
        if (begin == end) continue;
        parts.push_back(s.units[u].owned_part(e, shards[u]));
        weights.push_back(s.norm.weight_of(e.name));
      }
    squares = weighted_squares(parts, weights, device);
  }
  s.dp.all_reduce(squares);
  s.norm.sum_over_groups(squares);
  const double norm = std::sqrt(squares.item<double>());
  scale_to_max_norm(shards, norm, max_norm);
  return norm;
}

void DataParallel::sum_gradient_over(const std::string& name, comm::Group& copies) {
  Impl& s = *impl_;
  at::NoGradGuard no_grad;
  // With offload the sum goes to the host again (its copy there was taken in finish_gradients or
  // as the unit's last reduce-scatter was collected).
  if (s.stage <= 1) {
    for (size_t b = 0; b < s.buckets.size(); ++b)
      for (size_t i : s.buckets[b].params)
        if (s.params[i].first == name) {
          copies.all_reduce(s.grad_views[i]);
          if (s.offload) s.offload->grads_to_host(b);
          return;
        }
  } else {
    for (size_t u = 0; u < s.units.size(); ++u)
      if (s.units[u].entries().size() == 1 && s.units[u].entries().front().name == name) {
        copies.all_reduce(s.grad_shards[u]);
        if (s.offload) s.offload->grads_to_host(u);
        return;
      }
  }
  fail("internal: DataParallel has no parameter '", name, "' in a unit of its own");
}

UpdateResult DataParallel::apply(double lr, double max_norm) {
  UpdateResult result;
  result.grad_norm = at::scalar_tensor(clip_grad_norm(max_norm), at::kDouble);
  step(lr);
  zero_grad();
  return result;
}

void DataParallel::step(double lr) {
  Impl& s = *impl_;
  if (s.offload) s.offload->wait();
  s.optimizer->step(lr);
  if (s.offload) s.offload->masters_to_device(s.units);
  if (s.stage == 1 || s.stage == 2) {  // stage 3 fetches each unit at its next use
    std::vector<comm::Work> works;
    for (auto& u : s.units) works.push_back(u.gather_async());
    for (auto& w : works) w.wait();
  }
}

void DataParallel::zero_grad() {
  Impl& s = *impl_;
  at::NoGradGuard no_grad;
  if (s.stage <= 1) {
    for (auto& b : s.buckets) b.grad.zero_();
    for (size_t i = 0; i < s.params.size(); ++i) s.params[i].second.mutable_grad() = s.grad_views[i];
    return;
  }
  for (auto& g : s.grad_shards) g.zero_();
  for (auto& [name, p] : s.params) p.mutable_grad().reset();
}

}  // namespace tessera
