// ShardedHome: ZeRO-3's home (home.h) over a model's FlatUnits (flat_unit.h). A residency unit
// (one per part: a block, the ends) is made of zero or more FlatUnits, one per reduction group of
// its parameters (a block with experts: the dense parameters and the experts; none for a part
// another pipeline stage holds); a fetch materializes each and all-gathers it from the group's
// shards (one Work for all of them), a release frees them.
//
// Completion. On Gloo and on NCCL today waiting on a fetch blocks the host until the gather
// finished (comm/group.h: Work::wait returns after the comm stream was synchronized), so the
// compute stream never runs ahead of a gather it reads; an event the compute stream waits on
// instead is the GPU issue's work.
//
// Invariants: the FlatUnits outlive the home; nothing else materializes or releases them while it
// is used; every rank of a group issues the same fetches in the same order (they are collectives).
#pragma once

#include <cstddef>
#include <vector>

#include "memory/residency/flat_unit.h"
#include "memory/residency/home.h"

namespace tessera {

class ShardedHome final : public Home {
 public:
  // members[u]: the FlatUnits (indices into `flats`) of unit u.
  ShardedHome(std::vector<FlatUnit>& flats, std::vector<std::vector<size_t>> members);

  size_t units() const override { return members_.size(); }
  bool materialized(size_t unit) const override;
  // The Works before it are waited here (they are released gathers: done, or a collective every
  // rank completes in the same order).
  comm::Work fetch(size_t unit, std::vector<comm::Work> after) override;
  comm::Work release(size_t unit, std::vector<comm::Work> after) override;
  const std::vector<size_t>& members(size_t unit) const { return members_[unit]; }

 private:
  std::vector<FlatUnit>& flats_;
  std::vector<std::vector<size_t>> members_;
};

}  // namespace tessera
