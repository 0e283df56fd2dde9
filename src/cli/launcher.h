// `tessera train --nproc N`: the local launcher. It starts N copies of this very command line
// (without the launcher flags) as ranks node_rank * N ... node_rank * N + N - 1 of a world of
// N * nnodes, with the torchrun variables set, and supervises them:
// - the rendezvous store's socket is bound here, to the --master address only, and handed to
//   global rank 0 (node 0), so there is no port race and no listening on every interface;
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
  std::string master;  // host:port of the store; default 127.0.0.1 with a free port (one node only)
};

// Elastic restart (parallel.max_restarts, one node only): when a worker fails (not a stop or an
// interrupt), the launcher starts the run again as `train --resume RUN_DIR --set parallel.dp=0` on
// the workers that are left, in whole data-parallel replicas of `model_parallel` ranks (world / dp),
// from the run's latest checkpoint, at most `max` times; each restart appends
// {"step", "restart", "world", "failure"} to metrics.jsonl. The global batch stays the same when
// train.global_batch_size is set (the micro-batches per step grow), else it shrinks with dp.
struct Restarts {
  int64_t max = 0;
  int64_t model_parallel = 1;
};

// Runs the workers to completion; returns the launcher's exit code.
int launch_workers(const LaunchOptions& options, const std::string& run_dir, double stop_grace_s,
                   const Restarts& restarts = {});

}  // namespace tessera::cli
