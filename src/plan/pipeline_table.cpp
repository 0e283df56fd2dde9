// The pipeline table a run executes (pipeline_table.h).
#include "plan/pipeline_table.h"

#include "parallel/pipeline/schedule_builders.h"
#include "parallel/pipeline/simulate.h"

namespace tessera {

PipelineTable::PipelineTable(const ParallelOptions& parallel, const Layout& layout)
    : parallel_(parallel),
      pp_(layout.dims().pp()),
      gathers_(layout_gathers(parallel, layout.dims())),
      table_(layout.schedule()) {}

const pipeline::Schedule& PipelineTable::for_micro_batches(int64_t micro_batches) {
  if (table_.micro_batches != micro_batches) table_ = build(micro_batches, costs_);
  return table_;
}

bool PipelineTable::wants_measured_costs(int64_t step) const {
  return step == kMeasuredStep && parallel_.table_for_measured_costs();
}

void PipelineTable::offer_measured(const pipeline::ActionCosts& measured, int64_t step) {
  pipeline::Schedule candidate = build(table_.micro_batches, measured);
  if (pipeline::simulate_schedule(candidate, measured).step_time <
      pipeline::simulate_schedule(table_, measured).step_time) {
    table_ = std::move(candidate);
    costs_ = measured;
    note_ = "built for the costs measured at step " + std::to_string(step);
  } else {
    note_ = "the unit-cost table (one built for the costs measured at step " + std::to_string(step) +
            " was not faster in the simulator)";
  }
}

pipeline::Schedule PipelineTable::build(int64_t micro_batches, const pipeline::ActionCosts& costs) const {
  return pipeline::schedule_for_options(parallel_, pp_, micro_batches, gathers_, costs);
}

}  // namespace tessera
