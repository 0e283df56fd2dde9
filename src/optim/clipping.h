// Global gradient-norm clipping, as torch.nn.utils.clip_grad_norm_ with norm_type 2.
//
//   norm = sqrt(sum over params with a grad of ||grad||_2^2)      (each ||grad|| accumulated in fp32)
//   if max_norm > 0 and norm > max_norm: grad *= max_norm / (norm + 1e-6), in place
//
// The norm returned is the one before clipping. A nonfinite norm (inf/nan in some grad) is
// returned as is and the grads are left untouched, so the caller can see it and skip the step.
//
// clip_gradients_queued does the same without reading anything back to the host, for a step that
// must not wait on its device: the norm stays a float64 0-dim tensor on the gradients' device, and
// on a GPU the scaling multiplies by a coefficient the device computes (max_norm / (norm + 1e-6)
// where that rule clips, else exactly 1), as clip_grad_norm_ does. On the CPU, where nothing is
// queued, it scales as clip_gradients does, with no pass over unclipped gradients.
#pragma once

#include <vector>

#include <ATen/core/Tensor.h>

namespace tessera {

double clip_grad_norm(const std::vector<at::Tensor>& params, double max_norm);
// The same over the gradients themselves (defined tensors, in the order the parameters would give).
double clip_gradients(const std::vector<at::Tensor>& grads, double max_norm);
// The same, the norm left on the device (an undefined tensor reads as 0: no gradients).
at::Tensor clip_gradients_queued(const std::vector<at::Tensor>& grads, double max_norm);

// The scaling step alone, for callers that computed the global norm themselves (over shards, or
// summed over ranks): grads *= max_norm / (norm + 1e-6) when max_norm > 0 and a finite norm
// exceeds it; otherwise nothing.
void scale_to_max_norm(const std::vector<at::Tensor>& grads, double norm, double max_norm);

// sum_i weights[i] * ||tensors[i]||_2^2 as a float64 [1] tensor on `device` (each norm accumulated
// in fp32 by the multi-tensor kernel): one rank's share of a global squared norm, before it is
// summed over the ranks that hold other parts (tensors may be on several devices).
at::Tensor weighted_squares(const std::vector<at::Tensor>& tensors, const std::vector<double>& weights,
                            const at::Device& device);

}  // namespace tessera
