// `tessera train --nproc N`: the local launcher. It starts N copies of this very command line
// (without the launcher flags) as ranks of the world, with the torchrun variables set, and
// supervises them:
// - one node: the rendezvous store's socket is bound here, to the --master address only, and handed
//   to global rank 0, so there is no port race and no listening on every interface;
// - several nodes (--nnodes M --node-rank K --master HOST:PORT): the launchers agree through node 0's
//   launcher (comm/node_rendezvous.h) on each generation: every node's ranks (contiguous, in node
//   order), and the workers' store, which node 0's launcher binds on a fresh port of the --master
//   host and hands to rank 0; a failure on any node stops every node's workers, and the launchers
//   agree on its cause (a worker killed by a signal is preferred to one that exited with an error,
//   which may have failed on losing that one);
// - rank 0 of this node keeps the terminal; the others write to RUN_DIR/logs/rank_<r>.out;
// - when a worker fails, the others are stopped (SIGTERM, then SIGKILL) and the launcher exits
//   with the worker's code after printing which rank failed and the end of its output;
// - Ctrl-C (SIGINT) or SIGTERM on the launcher is forwarded to the workers as SIGTERM: they finish
//   their step, save a checkpoint and exit with kStoppedExitCode (train/stop_request.h), and so does
//   the launcher; workers still running `stop_grace_s` later are killed, and it exits with 130.
//   The workers run in a process group of their own, so a terminal's Ctrl-C reaches them only
//   through the launcher. A worker that exits with kStoppedExitCode (train.time_limit) has not failed.
#pragma once

#include <string>

namespace tessera::cli {

struct LaunchOptions {
  int nproc = 0;   // workers on this node (0 = not launching)
  int nnodes = 1;
  int node_rank = 0;
  std::string master;  // host:port of node 0: one node's store (default 127.0.0.1, a free port), or the launchers'
};

// Elastic restart (parallel.max_restarts): when a worker fails (not a stop or an interrupt), the
// launchers start the run again as `train --resume RUN_DIR --set parallel.dp=0` on the workers
// that are left, in whole data-parallel replicas of `model_parallel` ranks (world / dp), from the
// run's latest checkpoint, at most `max` times: the failed worker's node runs one worker fewer, a
// node whose launcher did not rejoin within parallel.timeout_s (a lost host) none, and workers are
// taken from the highest nodes until whole replicas are left (comm::next_generation). Each restart
// appends {"step", "restart", "world", "failure"} to metrics.jsonl (node 0's launcher). The global
// batch stays the same when train.global_batch_size is set (the micro-batches per step grow), else it
// shrinks with dp. Across nodes the run directory must be shared (checkpoint.gather = false), and
// the run cannot outlive node 0's launcher; a launcher started for a node the run goes on without
// (its host came back) rejoins it: node 0's launcher stops the workers with a checkpoint and the
// next generation has that node's workers too (not counted as a restart; "rejoined" in
// metrics.jsonl).
struct Restarts {
  int64_t max = 0;
  int64_t model_parallel = 1;
};

// Runs the workers to completion; returns the launcher's exit code. `stop_grace_s`
// (parallel.timeout_s) is also how long the launchers wait for each other at each generation.
int launch_workers(const LaunchOptions& options, const std::string& run_dir, double stop_grace_s,
                   const Restarts& restarts = {});

}  // namespace tessera::cli
