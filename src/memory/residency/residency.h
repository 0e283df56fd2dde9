// Residency: the executor of a ResidencyPlan (residency_plan.h) over a model's FlatUnits
// (flat_unit.h). A unit has a home, where its values live while it is not on the compute device,
// and a residency there: its flat storage, present between a fetch and a release. A plan's unit
// (one per part: a block, the ends) is made of one or more FlatUnits, one per reduction group of
// its parameters (a block with experts: the dense parameters and the experts); the plan's actions
// apply to all of them, in order.
//
// Home. Today one kind: sharded across the ranks of the FlatUnit's group (ZeRO-3): each rank keeps
// its shard (FlatUnit::shard) and a fetch all-gathers the flat buffer from the group's shards. ATOM's swap
// engine adds a home in host memory, filled over a copy stream (the offload copy stream,
// memory/offload/offload.h, is the pattern).
//
// Completion. A fetch returns at once with the gather in flight (comm::Work); complete waits for
// it. On Gloo and on NCCL today that wait blocks the host until the gather finished
// (comm/group.h: Work::wait returns after the comm stream was synchronized), so the compute stream
// never runs ahead of a gather it reads; an event the compute stream waits on instead is the GPU
// issue's work.
//
// Invariants:
// - The FlatUnits outlive the Residency; nothing else materializes or releases them while it
//   runs.
// - A unit in flight is materialized; release completes a fetch in flight before freeing, so the
//   group's collectives are never abandoned (every rank runs the same plan, so every rank issues
//   the same gathers in the same order).
// - Every rank runs the same plan at the same points: fetches are collectives.
#pragma once

#include <cstddef>
#include <vector>

#include "comm/group.h"
#include "memory/residency/flat_unit.h"
#include "memory/residency/residency_plan.h"

namespace tessera {

class Residency {
 public:
  // members[u]: the FlatUnits (indices into `flats`) of the plan's unit u.
  Residency(std::vector<FlatUnit>& flats, std::vector<std::vector<size_t>> members, ResidencyPlan plan);

  const ResidencyPlan& plan() const { return plan_; }
  // Runs the plan's actions at `point` of `pass`.
  void at(Pass pass, const ResidencyPoint& point);

  // Of the plan's units.
  void fetch(size_t unit);
  void complete(size_t unit);
  void release(size_t unit);
  bool resident(size_t unit) const;
  const std::vector<size_t>& members(size_t unit) const { return members_[unit]; }

  // Every unit released.
  void release_all();

 private:
  std::vector<FlatUnit>& flats_;
  std::vector<std::vector<size_t>> members_;
  ResidencyPlan plan_;
  std::vector<comm::Work> fetches_;  // per FlatUnit, a gather in flight
};

}  // namespace tessera
