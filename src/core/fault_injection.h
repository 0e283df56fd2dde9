// Fault injection: how the fault matrix (tests/cli/test_fault_matrix.cpp, test_swarm_faults.cpp)
// stops one rank at one phase of training.
// A process started with
//
//   TESSERA_FAULT=RANK:POINT:STEP:SIGNAL      e.g. TESSERA_FAULT=1:pp.send:3:STOP
//
// sends itself SIGNAL (KILL or STOP) the first time the process of global rank RANK reaches POINT
// in training step STEP or later. Points:
//   forward, backward, optimizer   the step runner, before a micro-batch's forward, before a
//                                  backward (B, I or W under a pipeline), before the update
//   checkpoint.write               a checkpoint save, with this rank's files partly written
//   swap.load, swap.store          the swap engine, issuing a sub-model's load or gradient store
//   swarm.group, swarm.reduce,     an ATOM peer's averaging round (atom/averaging.h): its start,
//   swarm.sum                      before the group forms; the group formed, before the parts are
//                                  sent; the first piece of this peer's part summed (every
//                                  member's piece of it in), before any of its sum goes back.
//                                  `tessera peer` is rank 0 of its own process.
//   <group>.<op>                   a communication operation of a mesh group, named as the flight
//                                  recorder and `tessera doctor` name it (comm/mesh.cpp): world,
//                                  or the first of dp, tp, pp, sp, ep, dp_sp, edp, edp_sp,
//                                  embedding, pp_down whose ranks it is (so under dp alone the
//                                  gradients reduce on "world", and under tp2 x dp2 on "dp");
//                                  <op> one of all_reduce, broadcast, all_gather, reduce_scatter,
//                                  all_to_all, send, recv, barrier. <group> * is any group (a
//                                  pipeline rank sends down on "pp" and up on "pp_down").
// Before the signal it writes one line to standard error, with the wall-clock time, so the
// matrix measures how long the survivors take to notice:
//   tessera: TESSERA_FAULT: rank 1 sends itself SIGSTOP at pp.send in step 3 (at 1764191234.512)
//
// Nothing else reads TESSERA_FAULT. Unset (every user run), point() is one load of a flag.
// A malformed value is refused at arm() with an error naming the variable.
#pragma once

#include <cstdint>
#include <string>

namespace tessera::fault {

// Reads TESSERA_FAULT for the process of global rank `rank` (called once the rank is known).
void arm(int64_t rank);
// The training step now running (1-based); points before the first step never fire.
void at_step(int64_t step);
// The process reached `point`.
void point(const char* point);
// A communication operation of group `group` (its mesh name: "world", "dp/0,1") whose text is
// `op` ("all_reduce of 4096 bytes"): the point "<group>.<first word of op>".
void comm_point(const std::string& group, const std::string& op);

}  // namespace tessera::fault
