// Top-k's step on one bucket (the algorithm and its state are described in topk.h).
//
// The all_gather message of one rank is [2k] float32: its k indices (int32 bit patterns) then
// their k values. Rank r's message lands at [r * 2k, (r + 1) * 2k) of the gathered [N * 2k].
// The indices a rank sends are distinct, so scattering one rank's values is a plain index_add
// with no colliding writes, and adding rank by rank fixes the summation order on every device.
#include "optim/compression/topk.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include "core/error.h"

namespace tessera {

namespace {
const char* const kPrefix = "topk";
}  // namespace

TopK::TopK(double ratio) : ratio_(ratio) {
  require(ratio > 0 && ratio <= 1, "parallel.topk_ratio must be in (0, 1] (got ", ratio, ")");
}

int64_t TopK::count(int64_t numel) const {
  const auto k = static_cast<int64_t>(std::ceil(ratio_ * static_cast<double>(numel)));
  return std::clamp<int64_t>(k, 1, std::max<int64_t>(numel, 1));
}

void TopK::all_reduce_mean(std::vector<at::Tensor>& grads, int64_t bucket, comm::Group& group) {
  if (grads.empty()) return;
  at::NoGradGuard no_grad;
  at::Tensor acc = compression::flatten_float(grads);
  const int64_t numel = acc.numel();
  if (numel == 0) return;
  require(numel <= std::numeric_limits<int32_t>::max(), "parallel.grad_compression = topk: bucket ", bucket, " has ",
          numel, " elements, more than int32 indices address; lower parallel.bucket_mb");
  Bucket& state = buckets_[bucket];
  if (!state.loaded_from.empty()) {
    state.residual = compression::checked_state(state.residual, numel,
                                                "bucket " + std::to_string(bucket) + "'s gradient elements",
                                                compression::state_name(kPrefix, bucket, "residual"),
                                                state.loaded_from, acc.device());
    state.loaded_from.clear();
  }
  if (state.residual.defined()) acc.add_(state.residual);

  const int64_t k = count(numel);
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
  compression::unflatten_into(mean, grads);

  acc.index_fill_(0, indices, 0.0);
  state.residual = acc;
}

NamedParams TopK::state() const {
  NamedParams out;
  for (const auto& [index, bucket] : buckets_)
    out.emplace_back(compression::state_name(kPrefix, index, "residual"), bucket.residual);
  return out;
}

void TopK::load_state(const std::map<std::string, at::Tensor>& state, const std::string& source) {
  std::map<int64_t, Bucket> loaded;
  for (const auto& [name, tensor] : state) {
    const int64_t index = compression::parse_state_name(name, kPrefix, {"residual"}, source).first;
    require(tensor.dim() == 1 && at::isFloatingType(tensor.scalar_type()), source, ": gradient-compression state ",
            name, " must be a 1-D floating tensor (got ", tensor.sizes(), " ", tensor.scalar_type(), ")");
    loaded[index] = Bucket{tensor, source};
  }
  buckets_ = std::move(loaded);
}

}  // namespace tessera
