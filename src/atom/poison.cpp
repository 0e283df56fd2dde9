// Poisoned contributions for tests and benchmarks (poison.h).
#include "atom/poison.h"

#include <cstdlib>

#include <torch/torch.h>

#include "core/error.h"

namespace tessera::atom {

std::unique_ptr<Poison> Poison::from_environment() {
  const char* value = std::getenv("TESSERA_SWARM_POISON");
  if (!value || !*value) return nullptr;
  const std::string mode = value;
  require(mode == "scale" || mode == "flip" || mode == "noise" || mode == "stale" || mode == "ascent",
          "TESSERA_SWARM_POISON must be scale, flip, noise, stale or ascent (got '", mode, "')");
  return std::unique_ptr<Poison>(new Poison(mode));
}

at::Tensor Poison::apply(const at::Tensor& contribution) {
  at::NoGradGuard no_grad;
  if (mode_ == "scale") return contribution * 1000;
  if (mode_ == "flip") return -contribution;
  if (mode_ == "ascent") return contribution * -1000;
  if (mode_ == "noise") {
    const at::Tensor noise = at::randn_like(contribution);
    return noise * (contribution.norm() / noise.norm().clamp_min(1e-30));
  }
  if (!first_.defined()) first_ = contribution.clone();
  return first_;
}

}  // namespace tessera::atom
