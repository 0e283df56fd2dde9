// cross_entropy_mean (cross_entropy.h).
#include "model/cross_entropy.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/autograd.h>

#if TESSERA_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>

#include "model/cross_entropy_kernels.h"
#endif

namespace tessera {
namespace {

constexpr int64_t kIgnored = -1;

#if TESSERA_WITH_CUDA
// Per-row losses of bf16 or fp16 logits [N, V] on a GPU (cross_entropy_kernels.h); the backward
// writes the logits' gradient in one pass from the logits and the saved logsumexp.
class FusedCrossEntropy : public torch::autograd::Function<FusedCrossEntropy> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& logits, const at::Tensor& targets) {
    const at::Tensor l = logits.contiguous(), t = targets.to(at::kLong).contiguous();
    const int64_t rows = l.size(0), V = l.size(1);
    at::Tensor loss = at::empty({rows}, l.options().dtype(at::kFloat)), lse = at::empty({rows}, loss.options());
    kernels::cross_entropy_forward(l.data_ptr(), l.scalar_type() == at::kHalf, t.data_ptr<int64_t>(),
                                   loss.data_ptr<float>(), lse.data_ptr<float>(), rows, V,
                                   at::cuda::getCurrentCUDAStream().stream());
    ctx->save_for_backward({l, t, lse});
    return loss;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &l = saved[0], &t = saved[1], &lse = saved[2];
    const at::Tensor dloss = grads[0].to(at::kFloat).contiguous();
    at::Tensor dlogits = at::empty_like(l);
    kernels::cross_entropy_backward(l.data_ptr(), l.scalar_type() == at::kHalf, t.data_ptr<int64_t>(),
                                    lse.data_ptr<float>(), dloss.data_ptr<float>(), dlogits.data_ptr(), l.size(0),
                                    l.size(1), at::cuda::getCurrentCUDAStream().stream());
    return {dlogits, at::Tensor()};
  }
};
#endif

}  // namespace

at::Tensor cross_entropy_mean(const at::Tensor& logits, const at::Tensor& targets) {
  if (logits.scalar_type() != at::kBFloat16 && logits.scalar_type() != at::kHalf)
    return at::cross_entropy_loss(logits.to(at::kFloat), targets, {}, at::Reduction::Mean, kIgnored);
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  const at::Tensor kept = targets != kIgnored;
#if TESSERA_WITH_CUDA
  if (logits.is_cuda() && logits.dim() == 2) return FusedCrossEntropy::apply(logits, targets).sum() / kept.sum();
#endif
  const at::Tensor picked = at::log_softmax(logits, -1).gather(1, targets.clamp_min(0).unsqueeze(1)).squeeze(1);
  return -(picked.to(at::kFloat) * kept).sum() / kept.sum();
}

}  // namespace tessera
