// Two adaptive-codec probes of one model and micro-batch compared slot by slot
// (parallel/activation_probe.h): a model-parallel group's against one process's.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "parallel/activation_probe.h"

namespace tessera::test {

// The worst relative difference of `split`'s int4 errors from `factor` times `whole`'s (a slot
// whose error is 0 in `whole` must be 0 in `split`); every block's slots and their elements must
// be the same (gtest expectations).
inline double worst_probe_difference(const ActivationProbe& whole, const ActivationProbe& split, double factor) {
  EXPECT_EQ(split.slots.size(), whole.slots.size());
  double worst = 0;
  for (const auto& [layer, slots] : whole.slots) {
    const auto it = split.slots.find(layer);
    if (it == split.slots.end() || it->second.size() != slots.size()) {
      ADD_FAILURE() << "block " << layer << " saved other slots in the split probe";
      continue;
    }
    for (size_t k = 0; k < slots.size(); ++k) {
      EXPECT_EQ(it->second[k].elements, slots[k].elements) << "block " << layer << " slot " << k;
      const double want = factor * whole.int4_error.at(layer)[k], got = split.int4_error.at(layer)[k];
      if (want > 0) worst = std::max(worst, std::abs(got - want) / want);
      else EXPECT_EQ(got, 0.0) << "block " << layer << " slot " << k;
    }
  }
  return worst;
}

}  // namespace tessera::test
