// Poisoned contributions, for the robust aggregation's tests and benchmark (test_swarm.cpp,
// bench/swarm_poison.py): a peer started with
//
//   TESSERA_SWARM_POISON=MODE      scale | flip | noise | stale | ascent
//
// sends in every round, in place of its contribution c (batch: its accumulated gradients x
// samples; DiLoCo: its pseudo-gradient, or its side of the low-rank product):
//   scale   1000 c
//   flip    -c
//   noise   Gaussian noise with c's norm
//   stale   the contribution it sent in its first round, every round after
//   ascent  -1000 c: gradient ascent that outweighs the others (scale and flip at once)
// It trains and applies the rounds' results as an honest peer does; only what it sends is
// poisoned, as a buggy or hostile member holding the key would. One mode corrupts its state instead:
//   bitflip after its first round, the last bit of its first parameter's first entry flips (a
//           silent data corruption, as a failing GPU's memory gives); it sends honestly, and its
//           replica has diverged from the others' (atom/swarm.h finds it)
// It says so in its log at start. Nothing else reads the variable; an unknown mode is refused
// naming it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace tessera::atom {

class Poison {
 public:
  // nullptr when TESSERA_SWARM_POISON is unset or empty.
  static std::unique_ptr<Poison> from_environment();
  const std::string& mode() const { return mode_; }
  std::string what() const;  // for the log at start
  at::Tensor apply(const at::Tensor& contribution);
  // bitflip, the first time: flips the bit in `masters` (true; the caller brings the model's copies
  // in line). Else false.
  bool corrupt(const std::vector<at::Tensor>& masters);

 private:
  explicit Poison(std::string mode) : mode_(std::move(mode)) {}
  std::string mode_;
  at::Tensor first_;  // stale: the first round's contribution
  bool flipped_ = false;
};

}  // namespace tessera::atom
