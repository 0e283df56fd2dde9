// cross_entropy_mean (cross_entropy.h).
#include "model/cross_entropy.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>

namespace tessera {

at::Tensor cross_entropy_mean(const at::Tensor& logits, const at::Tensor& targets) {
  constexpr int64_t kIgnored = -1;
  if (logits.scalar_type() != at::kBFloat16 && logits.scalar_type() != at::kHalf)
    return at::cross_entropy_loss(logits.to(at::kFloat), targets, {}, at::Reduction::Mean, kIgnored);
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  const at::Tensor kept = targets != kIgnored;
  const at::Tensor picked = at::log_softmax(logits, -1).gather(1, targets.clamp_min(0).unsqueeze(1)).squeeze(1);
  return -(picked.to(at::kFloat) * kept).sum() / kept.sum();
}

}  // namespace tessera
