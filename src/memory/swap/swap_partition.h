// The static partitioner of ATOM's swap engine (issue 14): where to cut the model into
// sub-models so that the device budget holds and the step is fastest.
//
// Input: one SubModel per block (first = l, end = l + 1) with its bytes and measured times, and a
// plan "shape" (the ends, the budget, the bandwidth, the micro-batches, defer_optim). Sub-models
// are contiguous runs of blocks; merging blocks sums their bytes and times.
//
// Search: dynamic programming over contiguous cuts, O(L^3) for L blocks, on a pairwise model of
// the plan: consecutive sub-models A, B (A before B) cost max(F_A, load_B) forward (B loads while
// A computes) plus max(B_B, load_A) backward, and may hold at once the ends (parameters and
// gradients), the activations of every block up to A's end, A's and B's parameters and the larger
// of their gradients; the last sub-model alone at the turn holds every activation and its own
// parameters and gradients. The pairs bound the plan's occupancy from above (validate_swap_plan,
// which is run on the result, is the truth), and their sum, with the first load, orders plans
// roughly as the replay does. A local search then polishes the cut with the exact check and the
// replay (move a boundary by one block, drop one, add one, while the replayed step gets faster);
// the returned plan's prediction is the replay's (simulate_swap_plan). Last, among the cuts whose
// replayed step is within kPeakTolerance of the fastest, the search moves to ones holding a lower
// device peak (the same moves while the peak falls): near-ties on time are decided by memory, so a
// run (measured block times) and tessera plan (priced ones) choose the same cut. When no pair-feasible cut
// exists the search starts from the finest cut (one block per sub-model) if that validates.
// Measured against an exhaustive search of small models (tests/unit/memory/test_swap_engine.cpp:
// within 5% of the best step time, never refusing when some cut fits).
//
// Refusals name the key memory.device_budget_gb and what does not fit: a block that cannot be on
// the device with its gradients and the activations held when it computes (naming the block and
// the bytes), or no cut at all.
#pragma once

#include <cstdint>
#include <vector>

#include "memory/swap/swap_plan.h"

namespace tessera::swap {

// How much slower than the fastest cut's replayed step a cut with a lower device peak may be and
// still be chosen: 1%. Measured block times move more than that between runs: the same swapped
// model on this machine cut its 4 blocks 1/1/1/1 one day and 1/2/1 another (docs/swap.md).
constexpr double kPeakTolerance = 0.01;

// The fastest valid plan, its actions built (build_swap_plan) and validated.
SwapPlan partition_swap_plan(const std::vector<SubModel>& blocks, const SwapPlan& shape);

// The plan of a given cut: sub-model i holds blocks [boundaries[i], boundaries[i+1]) (validated).
SwapPlan cut_swap_plan(const std::vector<SubModel>& blocks, const SwapPlan& shape, const std::vector<int64_t>& boundaries);

}  // namespace tessera::swap
