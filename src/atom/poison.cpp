// Poisoned contributions for tests and benchmarks (poison.h).
#include "atom/poison.h"

#include <cstdlib>

#include <ATen/ATen.h>

#include "core/error.h"

namespace tessera::atom {

std::unique_ptr<Poison> Poison::from_environment() {
  const char* value = std::getenv("TESSERA_SWARM_POISON");
  if (!value || !*value) return nullptr;
  const std::string mode = value;
  require(mode == "scale" || mode == "flip" || mode == "noise" || mode == "stale" || mode == "ascent" ||
              mode == "bitflip",
          "TESSERA_SWARM_POISON must be scale, flip, noise, stale, ascent or bitflip (got '", mode, "')");
  return std::unique_ptr<Poison>(new Poison(mode));
}

std::string Poison::what() const {
  return mode_ == "bitflip" ? "one bit of this peer's parameters flips after its first round (a test of the swarm's "
                              "divergence check)"
                            : "this peer sends poisoned contributions (a test of the swarm's aggregation)";
}

bool Poison::corrupt(const std::vector<at::Tensor>& masters) {
  if (mode_ != "bitflip" || flipped_ || masters.empty()) return false;
  at::NoGradGuard no_grad;
  at::Tensor entry = masters.front().view({-1}).narrow(0, 0, 1);
  entry.copy_(at::nextafter(entry, entry + 1));
  flipped_ = true;
  return true;
}

at::Tensor Poison::apply(const at::Tensor& contribution) {
  at::NoGradGuard no_grad;
  if (mode_ == "bitflip") return contribution;
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
