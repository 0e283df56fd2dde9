// PipelineTable: the one place that decides which pipeline table a run executes, and records it.
//
// It starts as the layout's table (plan/layout.h: its schedule for the step's micro-batches, with
// the parameter gathers layout_gathers decided). A step with another micro-batch count gets the
// same schedule built for that count, for the costs the current table was built for. ZB-V's and
// ZB-H1's tables depend on the action costs (unit costs at first): with
// parallel.pp_schedule_costs = measured (the default) the pipeline step measures each stage's
// F, B, I, W in step kMeasuredStep (the first pays for allocation and warm-up), averaged over the
// world so that every rank offers the same costs, and offer_measured() takes a table built for them
// where the simulator, fed with those costs, finds it faster than the current one. note() says
// what was decided, for the run's log and its bench fields.
//
// Invariants: every table it hands out holds the layout's gathers and the layout's placement of
// stages on ranks; every rank holds the same table at the same step (it decides from the world's
// averaged costs alone).
#pragma once

#include <cstdint>
#include <string>

#include "core/parallel_options.h"
#include "parallel/pipeline/schedule.h"
#include "plan/layout.h"

namespace tessera {

class PipelineTable {
 public:
  static constexpr int64_t kMeasuredStep = 2;

  PipelineTable(const ParallelOptions& parallel, const Layout& layout);

  // The table for `micro_batches`: the current one, built again when the count differs.
  const pipeline::Schedule& for_micro_batches(int64_t micro_batches);
  const pipeline::Schedule& current() const { return table_; }
  pipeline::Gathers gathers() const { return gathers_; }

  // Whether the run's `step`-th step (1-based) is the one whose measured costs the table is rebuilt
  // for (parallel.pp_schedule_costs = measured, at kMeasuredStep).
  bool wants_measured_costs(int64_t step) const;
  // A table built for `measured` (the world's mean stage costs of step `step`), taken where the
  // simulator with those costs finds it faster than the current one.
  void offer_measured(const pipeline::ActionCosts& measured, int64_t step);
  // How the current table was decided, once measured costs were offered; empty before.
  const std::string& note() const { return note_; }

 private:
  pipeline::Schedule build(int64_t micro_batches, const pipeline::ActionCosts& costs) const;

  ParallelOptions parallel_;
  int64_t pp_;
  pipeline::Gathers gathers_;
  pipeline::Schedule table_;
  pipeline::ActionCosts costs_;  // what table_ was built for (unit costs at first)
  std::string note_;
};

}  // namespace tessera
