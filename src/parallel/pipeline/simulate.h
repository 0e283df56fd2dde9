// Replaying a schedule table with per-action costs: when each action would start and end on each
// rank, the step time, the bubble and the peak of held activations. The validator uses it to find
// deadlocks; `tessera pipeline` prints it; the executor's measured timeline is drawn beside it.
//
// Semantics (the executor's): each rank runs its actions in order, one at a time.
//   F(s, j) needs F(s-1, j): on the same rank its end, across ranks its RECV_F.
//   B/I(s, j) needs F(s, j) on this rank and B/I(s+1, j): on the same rank its end, across ranks
//   its RECV_B. W(s, j) needs I(s, j).
//   SEND_* takes `send` on the rank (posting it; it completes in the background); the data
//   arrives `transfer` after the send was posted (with sends_share_a_link, after the rank's
//   previous send arrived where that is later). RECV_* waits until its data arrived, then takes
//   `post` (posting the row's next receive, as the executor does; a row with receives takes `post`
//   once before its first action too).
//   GATHER takes no time on the rank: the first GATHER holding a stage starts its fetch (a
//   collective of its data replicas, which run alike), which completes `gather` later, after the
//   rank's earlier fetches (they queue on one group); the first compute action on the stage after
//   it waits for that, and the wait is in the timeline as a GATHER entry (so the measured and the
//   replayed timelines show the exposed part of a gather). RELEASE drops a hold and takes nothing;
//   OPTIM waits for the rank's sends to arrive, then takes `optim`.
// Held activations: +1 at F, -1 at B or W (I frees nothing that W does not still need).
// Gathered stages: the stages with a hold (whole parameters, in units of one stage's).
// Busy time counts the compute actions only: a gather or the optimizer step is not pipeline work.
//
// A table in which some rank can never run its next action (a receive whose send never comes, an
// action before its own input) ends the replay early: `stuck` lists each blocked rank's action.
#pragma once

#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "parallel/pipeline/schedule.h"

namespace tessera::pipeline {

struct ActionCosts {
  double f = 1, b = 2, i = 1, w = 1;  // compute, per action (one stage, one micro-batch)
  double transfer = 0;                // from a send being posted to the data's arrival
  // Whether a rank's sends leave one after another through its one link (each waits for the one
  // before it to arrive: a slow link's bytes), rather than each `transfer` after it was posted.
  // The planner sets it (plan/cost_model.cpp); a measured replay's transfer is already each
  // send's own.
  bool sends_share_a_link = false;
  // Host time on the rank: posting a send (SEND_*), and posting the row's next receive (after each
  // RECV_* is taken, and once before the row's first action).
  double send = 0, post = 0;
  double gather = 0, optim = 0;       // a GATHER's fetch, an OPTIM
  // A measured run's stages and ranks differ (the embedding, the head and the loss; the optimizer
  // step of each rank's parameters): when given, per stage in place of f, b, i, w, and per rank in
  // place of optim.
  struct Compute {
    double f = 0, b = 0, i = 0, w = 0;
  };
  std::vector<Compute> stages;
  std::vector<double> rank_optim;
  // A replay of one measured step: each compute action's own duration, by (op, stage,
  // micro-batch), in place of its stage's.
  std::map<std::tuple<Op, int64_t, int64_t>, double> each;
  double of(Op op) const;
  // The cost of `a` on rank `rank`: its stage's or rank's where given, else of(a.op).
  double of(const Action& a, int64_t rank) const;
};

struct TimedAction {
  Action action;
  double start = 0, end = 0;
};

struct BlockedRank {
  int64_t rank = 0;
  int64_t index = 0;       // the action it cannot run, in schedule.ranks[rank]
  std::string waits_for;   // "2F3 on rank 2" / "1F4, later on this rank"
};

struct Simulation {
  std::vector<std::vector<TimedAction>> timeline;  // per rank, in order (compute and receives); empty when skipped
  double step_time = 0;                            // the last action's end
  std::vector<double> busy;                        // compute time per rank
  std::vector<int64_t> peak_held;                  // most activations held at once, per rank
  // Per rank, per k: the most activations held at once while k of them have run their I and await
  // their W (-1: never k at once). A micro-batch awaiting W holds its I's kept output gradients
  // and not what the split released (split_backward.h), so the memory estimate weighs those k
  // differently. Split by when: before the rank's first B or W has ended (the step has made no
  // parameter gradient there yet: a GPipe rank's forwards, a 1F1B warm-up), and from then on; the
  // memory estimate counts the gradients in the second only.
  std::vector<std::vector<int64_t>> peak_held_awaiting_w_before_gradients;
  std::vector<std::vector<int64_t>> peak_held_awaiting_w_with_gradients;
  std::vector<int64_t> peak_gathered;              // most stages gathered at once, per rank
  std::vector<BlockedRank> stuck;                  // empty when the table ran to its end

  // Idle share of pp x step_time.
  double bubble() const;
};

// `timeline`: record each action's start and end (what the pictures draw); replays that need only
// the step, the busy time, the peaks and the blocked ranks (the validator, the builders' and the
// planner's) leave it empty.
enum class Timeline : uint8_t { record, skip };
Simulation simulate_schedule(const Schedule& schedule, const ActionCosts& costs = {},
                             Timeline timeline = Timeline::record);

}  // namespace tessera::pipeline
