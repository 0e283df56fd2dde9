// splitmix64 (Steele, Lea, Flood 2014; the seeding generator of xoshiro): a bijective mix of a
// 64-bit value whose outputs for nearby inputs are unrelated. tessera derives every seed and
// deterministic choice from it (model initialisation per parameter name, the batch sampler, the
// random streams), so they are stable across builds and platforms.
#pragma once

#include <cstdint>

namespace tessera {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace tessera
