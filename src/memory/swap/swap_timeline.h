// A swap step's timeline as a picture: one row per stream (compute, load, store, host), one box
// per action from its start to its end (measured by the executor, or replayed by
// simulate_swap_plan), coloured by operation and labelled with its sub-model (core/gantt_svg.h).
#pragma once

#include <string>
#include <vector>

#include "memory/swap/swap_simulate.h"

namespace tessera::swap {

std::string swap_timeline_svg(const std::vector<TimedAction>& timeline, const std::string& title);

// Load time the compute stream waited for in a measured timeline: for each COMPUTE, the part of
// the gap since the compute stream's previous action that its LOAD was still running.
double exposed_load(const std::vector<TimedAction>& timeline);

}  // namespace tessera::swap
