// Measuring a schedule on real ranks without a model: every compute action sleeps its cost
// (ActionCosts x `unit_s` seconds), so the measured bubble is the schedule's and the transport's,
// not the machine's (compute-bound processes would slow each other on a small machine). The
// data each action passes on is a small tensor naming its (stage, micro-batch, direction), and
// each consumer checks it got the one it expects: a transfer routed to the wrong action fails,
// naming both.
#pragma once

#include <vector>

#include "comm/group.h"
#include "parallel/pipeline/simulate.h"

namespace tessera::pipeline {

struct MeasuredSchedule {
  std::vector<std::vector<TimedAction>> timeline;  // every rank's (all-gathered), each from its own start
  double step_time = 0;  // seconds, the slowest rank's end
  double bubble = 0;     // 1 - compute time (as it ran) summed over ranks / (pp x step_time)
};

// Collective over `pipe` (the pp group) and `down` (its "pp_down", executor.h).
MeasuredSchedule measure_schedule(const Schedule& schedule, comm::Group& pipe, comm::Group& down, const ActionCosts& costs,
                                  double unit_s);

}  // namespace tessera::pipeline
