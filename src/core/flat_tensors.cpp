// Tensor lists as one flat float32 vector (flat_tensors.h).
#include "core/flat_tensors.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

namespace tessera {

at::Tensor flatten_float(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> parts;
  parts.reserve(tensors.size());
  for (const at::Tensor& t : tensors) parts.push_back(t.detach().reshape({-1}).to(at::kFloat));
  return at::cat(parts);
}

void unflatten_into(const at::Tensor& flat, const std::vector<at::Tensor>& tensors) {
  at::NoGradGuard no_grad;
  int64_t offset = 0;
  for (const at::Tensor& t : tensors) {
    t.copy_(flat.narrow(0, offset, t.numel()).view(t.sizes()));
    offset += t.numel();
  }
}

}  // namespace tessera
