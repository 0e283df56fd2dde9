// Pipeline schedules as data (DESIGN.md "Schedules are data"): one ordered list of actions per
// pipeline rank, built by a generator (schedule_builders.h) or read from a CSV file, checked by
// validate_schedule, replayed by simulate_schedule and run by one executor.
//
// The model is cut into S = pp x v stages (v "virtual" chunks per rank). Placement says which
// rank holds stage s: `loop` puts stage s on rank s mod pp (GPipe, 1F1B, interleaved, ZB-H1);
// `vee` (v = 2) puts stages 0..pp-1 on ranks 0..pp-1 and stages pp..2pp-1 back on ranks pp-1..0,
// so rank 0 holds the first and the last stage (ZB-V, DualPipeV).
//
// An action is (op, stage, micro-batch):
//   F      forward of `stage` for micro-batch `micro`
//   B      the whole backward (input and weight gradients)
//   I, W   the backward split (zero bubble): I the input gradient, on the critical path; W the
//          weight gradient, any time after its I. Each (stage, micro-batch) has a B, or an I and
//          a W (the zero-bubble schedules split all; DualPipeV some).
//   SEND_F / RECV_F   the activation leaving stage s for stage s+1 (SEND_F carries the producing
//          stage s, RECV_F the consuming stage s+1); only between different ranks.
//   SEND_B / RECV_B   the gradient leaving stage s for stage s-1 (SEND_B: producer s, RECV_B:
//          consumer s-1).
// Sends are asynchronous (posted, completed later); a receive blocks until its data arrived.
// Parameter actions (add_parameter_actions; the micro field is 0):
//   GATHER / RELEASE  ZeRO-3 over the stage's data-parallel replicas: GATHER(s) starts bringing
//          the parameters of stage s in (an all-gather from their shards, a collective of the
//          replicas, which run the same row) and the row goes on while it is in flight; the first
//          compute action on s after it waits for it; from then to the RELEASE(s) matching the
//          GATHER they are whole on this rank, sharded again after. GATHERs are holds, counted per
//          stage: a stage gathered twice stays whole until both are released. In a table that
//          has them, every compute action of a stage has a hold on it.
//   OPTIM  the optimizer step: the gradients finished (reduced over the replicas, the tied
//          embedding's copies summed), clipped by the norm over every stage and applied. The last
//          action of each rank; the rank's sends are complete before it.
//
// Text form (as torch.distributed.pipelining writes actions): "<stage><OP><micro>", e.g. "0F3",
// "2I0", "1SEND_F4"; "<stage>GATHER", "<stage>RELEASE", "OPTIM". A CSV file holds one row per
// rank, one action per cell (empty cells ignored).
#pragma once

#include <cstdint>
#include <istream>
#include <string>
#include <vector>

namespace tessera::pipeline {

enum class Op : uint8_t { F, B, I, W, SendF, RecvF, SendB, RecvB, Gather, Release, Optim };
// "F", "SEND_B", "GATHER", "OPTIM" (as in the text form).
const char* op_name(Op op);

struct Action {
  Op op = Op::F;
  int64_t stage = 0;
  int64_t micro = 0;

  bool operator==(const Action& o) const { return op == o.op && stage == o.stage && micro == o.micro; }
  bool is_compute() const { return op == Op::F || op == Op::B || op == Op::I || op == Op::W; }
  bool is_parameter() const { return op == Op::Gather || op == Op::Release || op == Op::Optim; }
  bool is_transfer() const { return !is_compute() && !is_parameter(); }
  std::string str() const;  // "0F3", "1GATHER", "OPTIM"
};

// Parses "0F3", "1SEND_B2", "2GATHER", "OPTIM"; throws tessera::Error naming `where` on anything else.
Action parse_action(const std::string& text, const std::string& where);

enum class Placement : uint8_t { loop, vee };

struct Schedule {
  std::string name;            // gpipe, 1f1b, interleaved, zbh1, zbv, dualpipev, or the file's path
  int64_t pp = 1;              // pipeline ranks
  int64_t v = 1;               // stages per rank
  int64_t micro_batches = 1;   // m, the micro-batches of one optimizer step
  Placement placement = Placement::loop;
  // The most activations a rank may hold at once, in units of one micro-batch's activations for
  // one stage (a chunk); per rank; empty = no stated bound. The validator holds the table to it.
  std::vector<int64_t> peak_limit;
  std::vector<std::vector<Action>> ranks;  // ranks[r]: rank r's actions in order

  int64_t stages() const { return pp * v; }
  int64_t rank_of(int64_t stage) const;
  // Whether the backward of (stage, micro) is split into I and W (its rank's row has the I).
  bool split_backward(int64_t stage, int64_t micro) const;
};

// memory.resident_micro_batches = `resident` (> 0) on a rank running `row`: its forwards that keep
// their activations in host memory, in row order. A forward run while `resident` others on the
// rank (of any of its stages) have run forward and not yet their B or I is offloaded: the ones
// held longest, whose backward is furthest off, as they come; a resident one's place frees at its
// B or I. The executor offloads these (parallel/pipeline_step.h) and the planner prices them.
std::vector<Action> held_offloaded_forwards(const std::vector<Action>& row, int64_t resident);
// The same over every rank of `schedule`: how many forwards of each stage are offloaded.
std::vector<int64_t> held_offloaded_by_stage(const Schedule& schedule, int64_t resident);

// Inserts the SEND/RECV actions a table of compute actions needs: a receive just before the
// action that consumes it, a send just after the action that produces it, none between stages on
// one rank. Existing communication actions are removed first.
void add_communication(Schedule& schedule);

// How a table brings a stage's sharded parameters in (ZeRO-3 over its data-parallel replicas):
//   none        no GATHER/RELEASE (the parameters are whole on every rank);
//   per_step    one GATHER(s) for the rank's first action on stage s, RELEASE(s) after its last
//               compute action: the parameters are gathered once and kept for every micro-batch.
//               The GATHER is issued one compute action ahead (before the compute action
//               preceding that first action, ahead of that one's receive), so the all-gather
//               overlaps it; the rank's first gather goes ahead of its first action's receive;
//   per_action  one GATHER(s) for each compute action on s, ahead of the receive right before it
//               (so the all-gather overlaps the wait), RELEASE(s) right after the action
//               (parallel.zero3_reshard_per_microbatch): one stage whole at a time, at one gather
//               per compute action. Issuing it a compute action earlier would keep two stages
//               whole, which is per_step's memory for v = 2 and never releases a rank's only stage.
enum class Gathers : uint8_t { none, per_step, per_action };

// Replaces the table's parameter actions: GATHER/RELEASE by `gathers`, and OPTIM at the end of
// every rank's row.
void add_parameter_actions(Schedule& schedule, Gathers gathers);

// One row per rank of comma-separated actions.
std::string to_csv(const Schedule& schedule);
// Reads a CSV table for `pp` ranks, `v` stages each, `micro_batches` micro-batches, with
// `placement`; adds the communication when the file has none. Parameter actions in the file are
// kept (the training step replaces them by its own, add_parameter_actions). Errors name the file, row and cell.
Schedule read_schedule_csv(const std::string& path, int64_t pp, int64_t v, int64_t micro_batches, Placement placement);
// The same from a stream; `path` names it in errors (the fuzz target, tests/fuzz/, drives it).
Schedule read_schedule_csv(std::istream& in, const std::string& path, int64_t pp, int64_t v, int64_t micro_batches,
                           Placement placement);

// The table as a grid, one line per rank, one column per slot; `mark` (rank, index) is drawn
// as [action] (index -1: none). `compute_only` leaves out the communication actions (not the
// parameter actions).
std::string format_grid(const Schedule& schedule, bool compute_only = true, int64_t mark_rank = -1,
                        int64_t mark_index = -1);

}  // namespace tessera::pipeline
