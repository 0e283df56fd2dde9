// Stopping a run early, with a checkpoint: a scheduler's preemption (SIGTERM), Ctrl-C (SIGINT) or
// train.time_limit.
//
// stop_request::install() makes the first SIGTERM or SIGINT set a flag instead of ending the
// process; another one at least 2 s later ends it at once (the default action), for a user who
// does not want to wait for the checkpoint. (Closer repeats are one request delivered twice: Slurm
// signals every process of a job and the tessera launcher forwards the signal it got.) The trainer polls after every step (reason()) and, when any rank has a
// reason, every rank stops at that same step: the reasons are combined by a max all-reduce over
// the world, so ranks that saw no signal (another node, a worker the signal missed) or whose
// clock is behind stop too, and the checkpoint is one consistent step. The run then exits with
// kStoppedExitCode after saving.
//
// The tessera launcher forwards SIGTERM/SIGINT to its workers and waits for them (cli/launcher.h);
// torchrun and Slurm deliver SIGTERM to every worker themselves. The launcher also sends SIGTERM to
// every rank once one failed: the signal cuts short a failed operation's heartbeat diagnosis
// (comm::interrupt_diagnoses, comm/heartbeat.h), so a survivor fails and writes its flight record
// at once instead of being killed at the end of the launcher's grace.
#pragma once

#include <cstdint>
#include <string>

namespace tessera {

// The exit code of a run that stopped early with a checkpoint (resume it to continue).
constexpr int kStoppedExitCode = 3;

namespace stop_request {

enum Reason : int64_t { kNone = 0, kTimeLimit = 1, kSignal = 2 };

void install();
// Why this process wants to stop now: a signal, or `elapsed_s` past `time_limit_s` (0 = none).
Reason local_reason(double elapsed_s, double time_limit_s);
std::string describe(Reason reason, double time_limit_s);  // "SIGTERM received", "train.time_limit = 60 s reached"

}  // namespace stop_request
}  // namespace tessera
