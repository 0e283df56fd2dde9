// Top-k's step on one bucket (the algorithm, its warm-ups and its state are described in topk.h).
//
// The all_gather message of one rank is [2k] float32: its k indices (int32 bit patterns) then
// their k values. Rank r's message lands at [r * 2k, (r + 1) * 2k) of the gathered [N * 2k].
// The indices a rank sends are distinct, so scattering one rank's values is a plain index_add
// with no colliding writes, and adding rank by rank fixes the summation order on every device.
// Every rank counts the same steps per bucket, so all ranks agree on k at every step.
#include "optim/compression/topk.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include "core/error.h"
#include "core/flat_tensors.h"

namespace tessera {

namespace {
const char* const kTopKPrefix = "topk";
}  // namespace

TopK::TopK(double ratio, int64_t start_step, int64_t warmup_steps)
    : ratio_(ratio), start_step_(start_step), warmup_steps_(warmup_steps) {
  require(ratio > 0 && ratio <= 1, "parallel.topk_ratio must be in (0, 1] (got ", ratio, ")");
  require(start_step >= 0, "parallel.topk_start_step must be >= 0 (got ", start_step, ")");
  require(warmup_steps >= 0, "parallel.topk_warmup_steps must be >= 0 (got ", warmup_steps, ")");
}

double TopK::ratio_at(int64_t step) const {
  if (step < start_step_) return 1.0;
  const int64_t t = step - start_step_;
  if (t >= warmup_steps_) return ratio_;
  return std::pow(ratio_, static_cast<double>(t + 1) / static_cast<double>(warmup_steps_ + 1));
}

int64_t TopK::count(int64_t numel, int64_t step) const {
  const auto k = static_cast<int64_t>(std::ceil(ratio_at(step) * static_cast<double>(numel)));
  return std::clamp<int64_t>(k, 1, std::max<int64_t>(numel, 1));
}

void TopK::all_reduce_mean(std::vector<at::Tensor>& grads, int64_t bucket, comm::Group& group) {
  if (grads.empty()) return;
  at::NoGradGuard no_grad;
  Bucket& state = buckets_[bucket];
  const int64_t step = state.step++;
  if (step < start_step_) {
    group.all_reduce(grads, comm::ReduceOp::avg);
    return;
  }
  at::Tensor acc = flatten_float(grads);
  const int64_t numel = acc.numel();
  if (numel == 0) return;
  require(numel <= std::numeric_limits<int32_t>::max(), "parallel.grad_compression = topk: bucket ", bucket, " has ",
          numel, " elements, more than int32 indices address; lower parallel.bucket_mb");
  if (!state.loaded_from.empty()) {
    state.residual = compression::checked_state(state.residual, numel,
                                                "bucket " + std::to_string(bucket) + "'s gradient elements",
                                                compression::state_name(kTopKPrefix, bucket, "residual"),
                                                state.loaded_from, acc.device());
    state.loaded_from.clear();
  }
  if (state.residual.defined()) acc.add_(state.residual);

  const int64_t k = count(numel, step);
  if (group.size() * k >= numel) {
    group.all_reduce(acc, comm::ReduceOp::avg);
    unflatten_into(acc, grads);
    state.residual = at::zeros_like(acc);
    return;
  }
  const at::Tensor indices = std::get<1>(acc.abs().topk(k, /*dim=*/0, /*largest=*/true, /*sorted=*/false));
  const at::Tensor sent = at::cat({indices.to(at::kInt).view(at::kFloat), acc.index_select(0, indices)});
  at::Tensor gathered = at::empty({group.size() * 2 * k}, sent.options());
  group.all_gather(gathered, sent);

  at::Tensor mean = at::zeros_like(acc);
  for (int64_t r = 0; r < group.size(); ++r) {
    const at::Tensor from = gathered.narrow(0, r * 2 * k, 2 * k);
    mean.index_add_(0, from.narrow(0, 0, k).view(at::kInt), from.narrow(0, k, k));
  }
  mean.div_(static_cast<double>(group.size()));
  unflatten_into(mean, grads);

  acc.index_fill_(0, indices, 0.0);
  state.residual = acc;
}

NamedParams TopK::state() const {
  NamedParams out;
  for (const auto& [index, bucket] : buckets_) {
    out.emplace_back(compression::state_name(kTopKPrefix, index, "step"), at::scalar_tensor(bucket.step, at::kLong));
    if (bucket.residual.defined())
      out.emplace_back(compression::state_name(kTopKPrefix, index, "residual"), bucket.residual);
  }
  return out;
}

void TopK::load_state(const std::map<std::string, at::Tensor>& state, const std::string& source) {
  std::map<int64_t, Bucket> loaded;
  std::map<int64_t, bool> has_step;
  for (const auto& [name, tensor] : state) {
    const auto [index, slot] = compression::parse_state_name(name, kTopKPrefix, {"step", "residual"}, source);
    Bucket& bucket = loaded[index];
    if (slot == "step") {
      require(tensor.dim() == 0 && !at::isFloatingType(tensor.scalar_type()) && tensor.item<int64_t>() >= 0, source,
              ": gradient-compression state ", name, " must be a non-negative integer scalar");
      bucket.step = tensor.item<int64_t>();
      has_step[index] = true;
      continue;
    }
    require(tensor.dim() == 1 && at::isFloatingType(tensor.scalar_type()), source, ": gradient-compression state ",
            name, " must be a 1-D floating tensor (got ", tensor.sizes(), " ", tensor.scalar_type(), ")");
    bucket.residual = tensor;
    bucket.loaded_from = source;
  }
  for (const auto& [index, bucket] : loaded)
    require(has_step.count(index) > 0, source, ": gradient-compression state ",
            compression::state_name(kTopKPrefix, index, "step"), " is missing");
  buckets_ = std::move(loaded);
}

}  // namespace tessera
