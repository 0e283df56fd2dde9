// The swarm key of the atom unit tests (any 32 bytes do; these are 'k' x 32).
#pragma once

#include <string>

#include "atom/swarm_key.h"

namespace tessera::atom {

inline const SwarmKey kTestKey = SwarmKey::from_bytes(std::string(32, 'k'));

}  // namespace tessera::atom
