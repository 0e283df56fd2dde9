// A pipeline timeline as an SVG picture: one row per rank, one box per compute action placed at
// its start and end, coloured by micro-batch (hue) with F bright, B/I dark and W pale, receives
// drawn as thin grey waits, idle time left white. Used for the simulated schedule (`tessera
// pipeline --svg`) and, next to it, the executor's measured timeline.
#pragma once

#include <string>

#include "parallel/pipeline/simulate.h"

namespace tessera::pipeline {

// `title` heads the picture (e.g. "zbh1, pp 4, 8 micro-batches: bubble 8.6%").
std::string timeline_svg(const Schedule& schedule, const Simulation& simulation, const std::string& title);

}  // namespace tessera::pipeline
