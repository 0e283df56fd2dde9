// A pipeline whose ranks share a CPU node's cores (ClusterInfo::shared_slowdown > 1), replayed by
// the one pipeline simulator (parallel/pipeline/simulate.h) with each compute action's duration
// set by how many ranks compute beside it.
//
// The stages' costs are priced with every rank of the node computing at once (slowdown(world)),
// which is right for data parallelism, whose ranks all compute all the time, and wrong for a
// pipeline: during its fill and drain, and wherever a rank waits for a transfer, fewer ranks
// compute and each runs faster (four ranks on two cores: one alone runs 2.6x faster than four at
// once; bench/plan_slow_links.py's GPipe and 1F1B were predicted 35-40% slow without a link
// limit). The replay is a fixed point: simulate, find for each compute action the mean number of
// compute actions running during it (itself included, from the recorded timeline) times the
// pipeline's replicas (world / pp: its data, tensor, sequence and expert parallel peers run the
// same table at once on the node's other cores), set its duration to its cost at that sharing
// (ClusterInfo::slowdown_at, linear between one rank alone and the node full), and simulate
// again, each new duration averaged with the last (damping), until no duration moves by more than
// 0.5% or after 12 replays.
//
// A priced cost is taken as all CPU work slowed alike: its duration at k ranks is
// cost x slowdown(k) / slowdown(world) (the products' factor; memory-bound kernels slow a little
// less, which this leaves out). Durations never fall below cost / slowdown(world), the
// pipeline_lower_bound's premise (cost_model.cpp).
#pragma once

#include <cstdint>

#include "parallel/pipeline/simulate.h"
#include "plan/cluster.h"

namespace tessera::plan {

// Whether a layout of `world` ranks shares its node's cores: a CPU device slowed by its neighbours.
bool shares_cores(const Cluster& cluster, int64_t world);

// The replay above; `costs` priced at slowdown(world). The result's busy times are the replayed
// durations.
pipeline::Simulation simulate_on_shared_cores(const pipeline::Schedule& schedule, const pipeline::ActionCosts& costs,
                                              const Cluster& cluster, int64_t world);

}  // namespace tessera::plan
