// The swarm key of the swarm fuzz targets (swarm_messages signs peer records with it; swarm_wire's
// inputs never hold it): 32 bytes 'k'.
#pragma once

#include <string>

#include "atom/swarm_key.h"

namespace tessera::fuzz {

inline const atom::SwarmKey& swarm_key() {
  static const atom::SwarmKey key = atom::SwarmKey::from_bytes(std::string(32, 'k'));
  return key;
}

}  // namespace tessera::fuzz
