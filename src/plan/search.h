// The planner's search (`tessera plan`, docs/plan.md): every layout of a config on a world of
// ranks over the keys the user did not hold, each predicted by the cost model (plan/cost_model.h),
// ranked by predicted step time, what fits first.
//
// Searched keys (each held at the config's value when the user gave it with --set):
//   parallel.tp                  powers of two dividing the heads, at most a node's devices
//   parallel.sp                  powers of two dividing the sequence, sp x tp at most a node's
//                                devices (hold a larger sp with --set)
//   parallel.sp_method           with sp > 1: ulysses and ring (softmax attention), lasp and lasp2
//                                (linear attention)
//   parallel.ep                  with experts: powers of two dividing the experts and dp
//   parallel.pp                  divisors of model.n_layer (dp = world / (tp x pp x sp))
//   parallel.pp_schedule         1f1b, interleaved (2 stages per rank, and more where the blocks
//                                allow), zbh1, zbv, gpipe; with parallel.pp_virtual
//   parallel.zero_stage          0-3 (with data replicas)
//   parallel.offload             with ZeRO 1-3, where the cluster file prices the host
//   memory.swap                  one device per replica (on CUDA: one replica), where the cluster
//                                file prices the host; memory.device_budget_gb 90% of the device
//                                unless held
//   parallel.megatron_sp         with tp > 1 and a dense feed-forward
//   memory.activation_checkpointing  none, selective, full
//   train.batch_size             the micro-batch: powers of two dividing the global batch / dp
// The global batch (train.global_batch_size, else batch_size x grad_accum x the config's dp) is
// held: every layout trains the same sequences per step.
//
// ATOM swarms (Candidate::peers): where the cluster file has a [peers] link and no held key asks
// for more than one device per run, every rank as a `tessera peer` in batch mode (data
// parallelism's arithmetic), resident or swapped; holding swarm.sync plans swarms only (DiLoCo,
// which trains differently, only so).
//
// A candidate the layout checks refuse (the `check` given: parallel/layout_check.h's, which sits
// above this layer) or the cost model cannot build is skipped and counted. Every candidate is
// bounded below from its prices (cost_model.h's step_lower_bound); the checks, the memory
// estimate and the table run only for the layouts the branch and bound reaches (in the order of
// their bounds), so those counts are of the layouts examined. What layouts share is priced once:
// the operations per (tp, pp, sp, method, ep, Megatron-SP, checkpointing, micro-batch); the cuts,
// the tables and the memory estimate's layouts through a PlanCache (cost_model.h).
#pragma once

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "config/config.h"
#include "plan/cluster.h"
#include "plan/cost_model.h"

namespace tessera::plan {

struct Candidate {
  Config config;
  ParallelDims dims;
  Prediction prediction;
  // The searched keys as "section.key" -> value text, for the ready --set line.
  std::vector<std::pair<std::string, std::string>> set;
  // > 0: an ATOM swarm of this many peers (`tessera peer`, one device each; plan/swarm_cost.h);
  // `dims` then counts the peers as data-parallel ranks.
  int64_t peers = 0;
};

struct SearchResult {
  // Best first: the fastest layouts that fit (at most `top`), then those faster than the last of
  // them that do not fit; each with its memory estimated.
  std::vector<Candidate> layouts;
  int64_t considered = 0;
  int64_t refused = 0;             // by the layout checks or the cost model, among those examined
  int64_t predicted = 0;           // predicted whole; the others' lower bounds showed they could not be shown
  std::string first_refusal;       // one example, for a search that found nothing
};

using LayoutCheck = std::function<void(const Config&, const ParallelDims&)>;

// `held`: the "section.key" names given with --set (plan/search.h's list above). Layouts are
// predicted in the order of step_lower_bound until no remaining one can be among the `top`
// fastest that fit (cost_model.h).
SearchResult search_layouts(const Config& config, int64_t world, const std::set<std::string>& held,
                            const Cluster& cluster, const LayoutCheck& check, int64_t top,
                            const CostOptions& options = {});

// The keys search_layouts searches.
const std::vector<std::string>& searched_keys();

}  // namespace tessera::plan
