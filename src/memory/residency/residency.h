// Residency: the one residency layer. A unit of parameters (one per part of the model: a block,
// the ends; for the swap engine a sub-model of blocks, the ends) has a home (home.h), where its
// values live while it is not on the compute device: sharded over the ranks of a group (ZeRO-3,
// sharded_home.h) or in host memory (ATOM's swap engine, memory/swap/host_home.h). Residency is
// the one executor that brings units in and out, whatever the home and whatever drives it:
//
// - a ResidencyPlan (residency_plan.h) over the whole model, run at the points of a pass by the
//   model's wrappers (at(): ZeRO-3 without a pipeline);
// - a pipeline schedule (parallel/pipeline/schedule.h), whose GATHER holds a stage's units
//   (hold(): a fetch issued ahead of the compute action that needs them), each compute action
//   completing them first (complete()) and RELEASE dropping the hold (drop()). Holds are counted,
//   so a part that two holders share (the ends of a rank's two stages under V placement) stays
//   resident while either holds it;
// - a swap plan (memory/swap/swap_plan.h), whose LOAD fetches, whose computes complete and whose
//   EVICT releases, run by the swap executor (memory/swap/swap_executor.h).
//
// Order. A fetch returns at once with the movement in flight; complete waits for it. What else
// touches a unit's memory is told to the layer as a Work in flight, and the layer orders it:
//   reads(u, w)    w reads u's device storage (its gradients' store to the host): u's release
//                  waits for w;
//   writes(u, w)   w writes u's home (its optimizer update in host memory): u's next fetch waits
//                  for w;
// and a release still in flight (the swap engine's, on the store stream) is waited by the unit's
// next fetch. The home keeps that order on its own streams, so the caller never blocks for it.
//
// Invariants:
// - The home outlives the Residency; nothing else fetches or releases its units while it runs.
// - A release waits for the unit's fetch in flight, so a group's collectives are never
//   abandoned (every rank runs the same plan, so every rank issues the same gathers in order).
// - Every rank of a sharded home's group runs the same plan (or schedule row) at the same points.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "comm/group.h"
#include "memory/residency/home.h"
#include "memory/residency/residency_plan.h"

namespace tessera {

class Residency {
 public:
  // With a plan, the home's units are the plan's (blocks, then the ends); without, the caller
  // drives fetch/complete/release or hold/drop.
  explicit Residency(Home& home, std::optional<ResidencyPlan> plan = std::nullopt);

  bool planned() const { return plan_.has_value(); }
  const ResidencyPlan& plan() const { return *plan_; }
  // Runs the plan's actions at `point` of `pass` (planned() only).
  void at(Pass pass, const ResidencyPoint& point);

  void fetch(size_t unit);
  void complete(size_t unit);
  void release(size_t unit);
  // Materialized with no fetch in flight.
  bool resident(size_t unit) const;

  void reads(size_t unit, comm::Work work);
  void writes(size_t unit, comm::Work work);

  // Counted holds: the first hold fetches (it returns with the fetch in flight), the last drop
  // releases. A unit held is never released by release_all().
  void hold(size_t unit);
  void drop(size_t unit);
  int64_t holds(size_t unit) const { return holds_[unit]; }

  // Every unit released (none may be held).
  void release_all();
  // After a failure, once the home's streams ran dry: forgets every Work in flight and releases
  // every unit still materialized (none may be held).
  void reset();

 private:
  static std::vector<comm::Work> take(std::vector<comm::Work>& works);
  Home& home_;
  std::optional<ResidencyPlan> plan_;
  std::vector<comm::Work> fetches_;              // per unit, a fetch in flight
  std::vector<std::vector<comm::Work>> before_;  // per unit, what its next fetch waits for
  std::vector<std::vector<comm::Work>> readers_;  // per unit, what its next release waits for
  std::vector<int64_t> holds_;
};

}  // namespace tessera
