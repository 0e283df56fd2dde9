// Global gradient-norm clipping (clipping.h).
#include "optim/clipping.h"

#include <cmath>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

namespace tessera {

double clip_grad_norm(const std::vector<at::Tensor>& params, double max_norm) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> grads, norms;
  for (const auto& p : params) {
    const at::Tensor& g = p.grad();
    if (!g.defined()) continue;
    grads.push_back(g);
    // Per-grad norms on their own device, gathered on the CPU (grads may span devices).
    norms.push_back(at::linalg_vector_norm(g, 2, {}, false, at::kFloat).to(at::kCPU));
  }
  if (grads.empty()) return 0.0;
  const double norm = at::linalg_vector_norm(at::stack(norms), 2).item<double>();
  if (max_norm > 0 && std::isfinite(norm) && norm > max_norm) {
    const double coef = max_norm / (norm + 1e-6);
    for (auto& g : grads) {
      at::Tensor grad = g;
      grad.mul_(coef);
    }
  }
  return norm;
}

}  // namespace tessera
