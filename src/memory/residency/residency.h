// Residency: ZeRO-3's one residency layer over a model's FlatUnits (flat_unit.h), with and
// without a pipeline. A unit has a home, where its values live while it is not on the compute
// device, and a residency there: its flat storage, present between a fetch and a release. A unit
// (one per part: a block, the ends) is made of zero or more FlatUnits, one per reduction group of
// its parameters (a block with experts: the dense parameters and the experts; none for a part
// another pipeline stage holds); every action applies to all of them, in order.
//
// Two drivers, one executor:
// - a ResidencyPlan (residency_plan.h) over the whole model, run at the points of a pass by the
//   model's wrappers (at());
// - a pipeline schedule (parallel/pipeline/schedule.h), whose GATHER holds a stage's units
//   (hold(): a fetch issued ahead of the compute action that needs them), each compute action
//   completing them first (complete()) and RELEASE dropping the hold (drop()). Holds are counted,
//   so a part that two holders share (the ends of a rank's two stages under V placement) stays
//   resident while either holds it.
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
// - Every rank of a home's group runs the same plan (or schedule row) at the same points: fetches
//   are collectives, issued in the same order everywhere.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "comm/group.h"
#include "memory/residency/flat_unit.h"
#include "memory/residency/residency_plan.h"

namespace tessera {

class Residency {
 public:
  // members[u]: the FlatUnits (indices into `flats`) of unit u. With a plan, its units are these
  // (every one with a FlatUnit); without, the caller drives hold/complete/drop.
  Residency(std::vector<FlatUnit>& flats, std::vector<std::vector<size_t>> members,
            std::optional<ResidencyPlan> plan = std::nullopt);

  bool planned() const { return plan_.has_value(); }
  const ResidencyPlan& plan() const { return *plan_; }
  // Runs the plan's actions at `point` of `pass` (planned() only).
  void at(Pass pass, const ResidencyPoint& point);

  void fetch(size_t unit);
  void complete(size_t unit);
  void release(size_t unit);
  bool resident(size_t unit) const;
  const std::vector<size_t>& members(size_t unit) const { return members_[unit]; }

  // Counted holds: the first hold fetches (it returns with the fetch in flight), the last drop
  // releases. A unit held is never released by release_all().
  void hold(size_t unit);
  void drop(size_t unit);
  int64_t holds(size_t unit) const { return holds_[unit]; }

  // Every unit released (none may be held).
  void release_all();

 private:
  std::vector<FlatUnit>& flats_;
  std::vector<std::vector<size_t>> members_;
  std::optional<ResidencyPlan> plan_;
  std::vector<comm::Work> fetches_;  // per FlatUnit, a gather in flight
  std::vector<int64_t> holds_;       // per unit
};

}  // namespace tessera
