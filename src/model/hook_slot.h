// The rule of the model's single-owner hook slots (a layer's region, attention kernel, MoE routed
// step): parallelism applied from outside installs into an empty slot, or clears it with an
// empty value; installing over an installed one is refused, never a silent replacement of the
// first owner by the second. (Block wrappers, which compose, are TransformerLMImpl's.)
#pragma once

#include <utility>

#include "core/error.h"

namespace tessera {

// Slot: anything that converts to bool when set (std::function, ShardedRegion).
template <class Slot>
void install_once(Slot& slot, Slot value, const char* what) {
  require(!static_cast<bool>(value) || !static_cast<bool>(slot), "internal: ", what,
          " is already installed (one owner per layer)");
  slot = std::move(value);
}

}  // namespace tessera
