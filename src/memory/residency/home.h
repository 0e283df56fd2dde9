// Home: where a residency unit's values live while the unit is not on the compute device, and how
// they move (the residency layer, residency.h). Two kinds:
//
//   sharded   ZeRO-3 (sharded_home.h): each rank of a group keeps its shard; a fetch all-gathers
//             the unit's flat buffer over the group (a collective), a release frees it.
//   host      ATOM's swap engine (memory/swap/host_home.h): the values live in host memory; a
//             fetch copies them to the device over the load stream, a release frees the device
//             copy (after its gradients went to the host over the store stream).
//
// A fetch or release returns with the movement in flight (comm::Work); it starts only after the
// Works it is given (the unit's previous release and the writes of its home still in flight, or
// the reads of its device storage), so the residency layer states the order and the home keeps
// it without blocking the caller.
//
// Invariants:
// - materialized(u) is true from a fetch of u being issued until a release of u is issued,
//   whether or not the movement itself ran yet: it is the caller's view, kept on the calling
//   thread.
// - The Works a home returns outlive the home's jobs: waiting on one rethrows its failure.
#pragma once

#include <cstddef>
#include <vector>

#include "comm/group.h"

namespace tessera {

class Home {
 public:
  virtual ~Home() = default;
  virtual size_t units() const = 0;
  virtual bool materialized(size_t unit) const = 0;
  // Starts filling unit `unit`'s device storage from its home once `after` finished.
  virtual comm::Work fetch(size_t unit, std::vector<comm::Work> after) = 0;
  // Frees unit `unit`'s device storage once `after` finished (at once when they have).
  virtual comm::Work release(size_t unit, std::vector<comm::Work> after) = 0;
};

}  // namespace tessera
