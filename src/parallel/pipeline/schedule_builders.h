// The built-in pipeline schedules, as tables (schedule.h). Each builder gives every rank its
// compute actions in order, the communication added (add_communication), and the peak it promises
// (Schedule::peak_limit, in activations of one micro-batch for one stage), which the validator
// holds it to. With p ranks, m micro-batches, v stages per rank and unit costs F = I = W = 1
// (B = 2), the bubble (idle share of p x step time) each gives, checked by the simulator in tests:
//
//   gpipe        all F, then all B.                                     (p-1)/(m+p-1); peak m
//   1f1b         PipeDream-flush: rank r runs min(p-r-1, m) forwards, then
//                alternates F and B, then the remaining B.               (p-1)/(m+p-1); peak p-r
//   interleaved  Megatron's interleaved 1F1B over v chunks per rank
//                (stage c*p + r on rank r); m must be a multiple of p.   (p-1)/(v*m+p-1)
//   zbh1         zero bubble H1: B split into I and W; rank r runs p-r
//                forwards, then per micro-batch j: I_j, W_(j-r), the
//                next F; then its remaining W. Where the costs make a
//                whole backward B cheaper than its I + W, each I
//                made whole in turn where the step is no longer (one
//                pass, 2048 tries at most).                               (p-1)/(3m+p-1) for m >= p;
//                                                                        peak p on every rank
//   zbv          zero bubble V: two chunks per rank in V placement (rank
//                0 holds the first and the last stage); built by a
//                list scheduler in time with the given action costs
//                (unit costs by default): an I whose input is ready
//                first, then an F while fewer than 2p chunk
//                activations are held, then a W. Where the costs make
//                a whole backward B cheaper than its I + W, also with
//                at most k W's deferred per rank (k = 0..2p, a B in
//                place of an I beyond), then each I made whole in turn
//                where the step is no longer (one pass, 2048 tries at
//                most): the table the simulator with the costs finds
//                shortest.                                                (p-1)/(6m+p-1), the pipeline
//                                                                        fill alone, for m >= p; peak 2p
//   dualpipev    DeepSeek's DualPipeV: V placement, the forward of one chunk
//                paired with the backward of the other in the steady state,
//                zero-bubble I/W only at the ends (schedule_builders.cpp
//                lists its phases); m >= 2p.                              no formula (simulated: p 4,
//                                                                        m 8: 5.9%; m 16: 3.0%); peak 2p+1
//
// Refusals name the key: the micro-batches of a step are the accumulation count
// (train.global_batch_size / (train.batch_size x dp), or train.grad_accum).
#pragma once

#include <string>
#include <vector>

#include "core/parallel_options.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/simulate.h"

namespace tessera::pipeline {

// The names build_schedule knows.
const std::vector<std::string>& schedule_names();
// Where the built-in `name` puts its stages: vee for zbv and dualpipev, loop for the others.
Placement placement_of(const std::string& name);

// `name` with `pp` ranks, `micro_batches` micro-batches and `v` stages per rank (interleaved: >= 2;
// zbv: 2; the others: 1). `costs` (per stage where given) are what zbv's list scheduler places the
// actions by, and where zbv and zbh1 run backwards whole; the other tables do not depend on them.
// Throws tessera::Error naming parallel.pp_schedule / parallel.pp_virtual or the micro-batch count
// when the combination cannot be built.
Schedule build_schedule(const std::string& name, int64_t pp, int64_t micro_batches, int64_t v,
                        const ActionCosts& costs = {});

// The forward passes alone of `micro_batches` micro-batches on `like`'s ranks and placement, the
// communication added: the table evaluation runs through the executor. Each rank runs its stages
// of micro-batch 0 in stage order, then micro-batch 1's, and so on, so every receive's send comes
// earlier in its sender's row than anything that waits on the receiver (no cycle). Not a training
// table (no backward, no OPTIM; validate_schedule would refuse it).
Schedule forward_only_schedule(const Schedule& like, int64_t micro_batches);

// Micro-batch 0's forward through every stage of `like`'s ranks and placement, then its whole
// backward (B) through them in reverse, the communication added: the adaptive codecs' census
// (parallel/activation_probe.h). Each rank's row is its part of that one sequential order, so
// no receive waits on anything its sender runs later. Not a training table (no OPTIM).
Schedule census_schedule(const Schedule& like);

// A layout's schedule table: parallel.pp_schedule (a built-in, or file:PATH read as a CSV table) on
// `pp` ranks with parallel.pp_virtual stages each and `micro_batches` (the step's accumulation
// count at its dp), with its parameter actions (`gathers`, and OPTIM), validated. Refusals name the
// keys or the file. `costs`: as for build_schedule.
Schedule schedule_for_options(const ParallelOptions& parallel, int64_t pp, int64_t micro_batches,
                              Gathers gathers = Gathers::none, const ActionCosts& costs = {});

}  // namespace tessera::pipeline
