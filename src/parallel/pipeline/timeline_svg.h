// Pipeline timelines for people. timeline_svg: an SVG picture (core/gantt_svg.h), one row per
// rank, one box per compute action placed at its start and end, coloured by micro-batch (hue)
// with F bright, B/I dark and W pale, ZeRO-3 GATHERs grey and the optimizer step dark grey,
// receives drawn as thin grey waits, idle time left white. Used for the simulated schedule
// (`tessera pipeline --svg`) and, next to it, the executor's measured timeline.
#pragma once

#include <string>

#include "parallel/pipeline/simulate.h"

namespace tessera::pipeline {

// `title` heads the picture (e.g. "zbh1, pp 4, 8 micro-batches: bubble 8.6%").
std::string timeline_svg(const Schedule& schedule, const Simulation& simulation, const std::string& title);

// The same as a Chrome trace (JSON, open in Perfetto or chrome://tracing): one process per rank,
// one complete event per compute action, receive, GATHER and OPTIM, times in microseconds.
std::string timeline_chrome_trace(const std::vector<std::vector<TimedAction>>& timeline, double seconds_per_unit);

}  // namespace tessera::pipeline
