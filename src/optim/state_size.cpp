// The optimizer state's size from a parameter's shape (state_size.h).
#include "optim/state_size.h"

namespace tessera {

double optimizer_state_bytes(const OptimOptions& optim, const at::Tensor& p, double share) {
  const double local = static_cast<double>(p.numel()) * share;
  if (optim.name == "sgd") return optim.momentum > 0 ? 4 * local : 0;
  if (optim.name != "adafactor") return 8 * local;
  const double first_moment = optim.adafactor_beta1 > 0 ? 4 * local : 0;
  if (p.dim() < 2) return 4 * local + first_moment;
  const double rows = static_cast<double>(p.numel() / p.size(-1)), cols = static_cast<double>(p.numel() / p.size(-2));
  return 4 * (rows + cols) * share + first_moment;
}

}  // namespace tessera
