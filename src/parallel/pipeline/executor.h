// The one executor of pipeline schedules: runs this rank's row of a validated table (schedule.h)
// over the pipeline group, in order, and records when each action ran.
//
// What an action computes is the caller's (StageWork::compute): the model's stages for training,
// fixed sleeps for measuring a schedule's bubble. The executor moves the data between them:
//   F(s, j)   gets the activation of F(s-1, j): received (RECV_F) or, when stage s-1 is on this
//             rank (V placement), handed over directly; stage 0 gets none. What F returns goes
//             to F(s+1, j) the same way (SEND_F, or directly).
//   B/I(s, j) gets the gradient B/I(s+1, j) returned (received by RECV_B, or directly); the last
//             stage gets none. What it returns goes to stage s-1. W gets and returns nothing.
// Parameter actions (GATHER, RELEASE, OPTIM) go to StageWork::parameters; before OPTIM every send
// of the step is waited for. A GATHER that takes a stage's first hold starts its fetch and returns;
// the next compute action on that stage first calls StageWork::complete, and the time it waited
// is the timeline's GATHER entry (the exposed part of the gather).
// Transfers: SEND_* posts an asynchronous send (comm::Group::send_async) and goes on. Gloo reports
// a send finished only from its wait, so a send is waited when the rank knows it arrived: when it
// takes a receive that the peer sent after taking that send (arrived_sends), which frees its buffer
// within the step; the others before OPTIM. Each receive is
// posted ahead (comm::Group::recv_async, into a buffer from StageWork::receive_buffer): the row's
// next RECV_* is posted as soon as the one before it was taken (the first at the start), so its
// data lands while the rank computes, and RECV_* waits only for what has not arrived yet. A
// transfer's tag is (direction, consuming stage, micro-batch), so a receive can only match its own
// send; it goes over one of two groups by the direction between the ranks (run_schedule's `down`).
// Every send is waited before run_schedule returns. A peer that dies or stalls surfaces as the group's error
// (naming the rank, within parallel.timeout_s), prefixed with this rank's action.
//
// Invariants: the table passed validate_schedule (the executor trusts its order); StageWork is
// called only for compute and parameter actions, on this rank's stages, in table order.
#pragma once

#include <functional>
#include <map>
#include <tuple>
#include <vector>

#include <ATen/core/Tensor.h>

#include "comm/group.h"
#include "parallel/pipeline/simulate.h"

namespace tessera::pipeline {

struct StageWork {
  // Runs compute action `action` with `input` (undefined where there is none); returns what goes
  // on (undefined where nothing does: W, the last stage's F output is the caller's, stage 0's
  // input gradient).
  std::function<at::Tensor(const Action& action, const at::Tensor& input)> compute;
  // An empty tensor of the shape and dtype that RECV action `recv` receives.
  std::function<at::Tensor(const Action& recv)> receive_buffer;
  // Told when RECV action `recv` is posted, ahead of the action that waits for it (may be unset).
  std::function<void(const Action& recv)> receive_posted;
  // Runs a GATHER (starts the stage's fetch), RELEASE or OPTIM (unset: the table must have none).
  std::function<void(const Action& action)> parameters;
  // Waits for the fetch of compute action `action`'s stage (set when the table has GATHERs).
  std::function<void(const Action& action)> complete;
};

// Runs rank pipe.rank()'s actions of `schedule` (pipe: the pp group, group rank = pipeline rank).
// Returns the compute actions, sends (the time posting took), receives (the time waited), GATHER
// waits and OPTIM with their start and end in seconds since the call; `started`, when given, is
// set to the steady clock's reading (seconds) at that zero.
// `down` has pipe's members and a connection of its own (the mesh's "pp_down", comm/mesh.h): a
// transfer to a lower pipeline rank goes over it, one to a higher rank over `pipe`, so the two
// directions between two ranks never share a connection (on one Gloo pair a send stalls for
// milliseconds while the peer sends the other way).
std::vector<TimedAction> run_schedule(const Schedule& schedule, comm::Group& pipe, comm::Group& down,
                                      const StageWork& work, double* started = nullptr);

// For each receive of rank `me`'s row (by its index in the row), the sends of `me` that the sender
// took (its RECV done) before it posted the send this receive takes, as (direction 0 forward / 1
// backward, consuming stage, micro-batch): once the receive is done they have arrived, so
// run_schedule waits for them there (it returns at once) and their buffers go.
std::map<size_t, std::vector<std::tuple<int64_t, int64_t, int64_t>>> arrived_sends(const Schedule& schedule, int64_t me);

// Every rank's timeline (from run_schedule) on every rank, in rank order (a collective of `pipe`);
// each rank's times are from its own start.
std::vector<std::vector<TimedAction>> gather_timelines(comm::Group& pipe, const std::vector<TimedAction>& mine);

// This rank's steady clock minus pipeline rank 0's, in seconds (0 on rank 0), from the ping-pong
// round with the least round trip of `rounds` with rank 0 (blocking point-to-point: a collective
// of `pipe`). Ranks on one host share the clock (about 0); on several hosts the estimate is good
// to about half the least round trip.
double clock_offset(comm::Group& pipe, int rounds = 16);

// What the transfers of a measured run cost, as the simulator's ActionCosts means them
// (simulate.h), from `timelines` as gather_timelines gives them and `started[r]`, rank r's zero on
// one common clock (run_schedule's `started` minus clock_offset):
//   send      the mean time posting a send took;
//   post      the mean time from a receive's end to the rank's next entry (posting the row's next
//             receive), and from a row's zero to its first entry when it has receives;
//   transfer  the median, over the receives that waited for their data, of the time from the send
//             being posted to the wait ending (0 when no receive waited: no transfer was on the
//             way of the work).
struct TransferCosts {
  double transfer = 0, send = 0, post = 0;
};
TransferCosts transfer_costs(const std::vector<std::vector<TimedAction>>& timelines, const std::vector<double>& started);

}  // namespace tessera::pipeline
