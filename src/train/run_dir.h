// Who may write a run directory (`tessera train --out DIR`). A run directory holds one run: its
// config.toml, metrics.jsonl, events.out.tfevents.tessera (TensorBoard's), train.log and
// checkpoints/ (and logs/, which does not mark a run: run_dir.cpp). Two rules keep a run from being lost or mixed with another:
//
// - Claim. Training into a directory that already holds a run is refused unless the run continues
//   it (`--resume` of one of its own checkpoints: the run resumes in place) or `--overwrite` is
//   given, which removes the old run's files first (and only those: anything else in the
//   directory stays). `--resume CHECKPOINT` without `--out` continues the checkpoint's own run
//   directory (the parent of its checkpoints/).
// - Lock. The run holds an exclusive flock(2) on DIR/run.lock for as long as it runs; a second
//   run on the same directory is refused naming the holder's pid. The lock belongs to the open
//   file, not the process, and is inherited by the workers a launcher starts, so it holds while
//   any process of the run is alive and goes by itself when the last one exits (never stale).
//
// One process per run claims and locks: the `--nproc` launcher of node 0, or without one (one
// process, torchrun, mpirun, srun) global rank 0 before it joins the mesh, so no other rank
// writes into the directory before the claim (they cannot pass Mesh::connect without rank 0).
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace tessera {
namespace comm {
class Group;
}

// The files of a run that DIR holds, relative names ("config.toml", "checkpoints/", ...); empty
// when it holds none (or does not exist).
std::vector<std::string> run_files(const std::string& dir);

// The run directory a checkpoint belongs to (DIR for DIR/checkpoints/step_N), or "" when the
// checkpoint is not inside one.
std::string run_dir_of_checkpoint(const std::string& checkpoint_dir);

struct RunClaim {
  bool overwrite = false;   // --overwrite
  std::string resume_from;  // the resolved checkpoint directory of --resume ("" without)
};

class RunLock {
 public:
  // Takes the lock on `dir`/run.lock (creating `dir`), or throws naming the directory and the pid
  // holding it.
  explicit RunLock(const std::string& dir);
  ~RunLock();
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

 private:
  int fd_ = -1;
};

// Applies the claim rules above without touching anything: throws naming the directory, what it
// holds and the flags that would allow it, or says what claiming would do ("DIR (new)", "DIR (the
// run continues in place)", ...). `tessera train --dry-run` prints it.
std::string describe_claim(const std::string& dir, const RunClaim& claim);

// Every rank of a run writes its checkpoint shards into the same run directory, so on several
// hosts --out must be one directory all of them see (a shared filesystem). Checked when the mesh
// is up, before any step: rank 0 writes DIR/.shared-check holding a random token, every rank reads
// its own `dir` and compares, and the ranks that cannot see it are named on every rank, so a run
// on unshared directories fails at once instead of at its first checkpoint, after the work.
// With `gather` (checkpoint.gather: rank 0 writes whole checkpoints) unshared directories are
// allowed. Collective: every rank calls it.
void check_shared_run_dir(const std::string& dir, comm::Group& world, bool gather);

// Locks `dir`, then applies the claim rules (describe_claim) and, with --overwrite, deletes the old
// run's files; then removes the checkpoint saves a killed run left unfinished (checkpoint.h's
// remove_interrupted_saves), saying so. `tessera train` (its lead process) and `tessera peer` call it.
std::unique_ptr<RunLock> claim_run_dir(const std::string& dir, const RunClaim& claim);

}  // namespace tessera
