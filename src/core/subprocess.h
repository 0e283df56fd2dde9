// Child processes for the local launcher (`tessera train --nproc`) and the multi-rank tests.
//
// spawn() forks and execs at once (nothing but dup2, prctl and execve runs between the two, so a
// parent with threads is safe). A child never outlives the thread that spawned it: it is killed
// (SIGKILL, PR_SET_PDEATHSIG) when that thread's process dies, however it dies (a SIGKILLed
// launcher leaves no workers running, holding GPUs and the run directory's lock). supervise() waits for a set of children and never hangs: it ends when all
// have exited, when `deadline_s` passes (the rest are killed), or when *interrupted becomes true
// (Ctrl-C on the launcher: SIGTERM to every child, SIGKILL after `interrupt_grace_s`, time for them
// to checkpoint). With stop_on_failure, the first child to fail (an exit code not in `ok_codes`,
// or a signal) makes it stop the others: SIGTERM, then SIGKILL after `grace_s`; a child stopped by a
// signal (SIGSTOP: it cannot act on SIGTERM) is killed at once. `outside`, when given, is polled
// on every pass (about every 20 ms) until it asks for a stop: `failed` stops the children as a
// failure of one of them would, `checkpoint` as an interrupt would (SIGTERM, SIGKILL after
// interrupt_grace_s: time to save a checkpoint); the launcher of a node whose run failed, or is
// being resized, on another node.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <string>
#include <sys/types.h>
#include <vector>

namespace tessera {

struct ChildSpec {
  std::vector<std::string> argv;            // argv[0] is the program path
  std::map<std::string, std::string> env;   // added to (or replacing in) this process's environment
  std::string output_file;                  // stdout and stderr go here; empty = inherited
  int inherit_fd = -1;                      // a descriptor the child keeps across exec
  bool own_process_group = false;           // setpgid(0, 0): a terminal's Ctrl-C does not reach it
};

pid_t spawn(const ChildSpec& spec);

struct ChildExit {
  pid_t pid = -1;
  int code = -1;    // exit code, or -1 when killed by a signal
  int signal = 0;
  bool stopped_by_supervisor = false;  // we sent the signal (another child failed, timeout, Ctrl-C)
  std::string describe() const;  // "exited with code 2" / "killed by signal 9 (SIGKILL)"
};

struct SuperviseOptions {
  double deadline_s = 0;       // 0 = no deadline
  bool stop_on_failure = true;
  double grace_s = 5;
  double interrupt_grace_s = 5;
  std::vector<int> ok_codes = {0};
  const std::atomic<bool>* interrupted = nullptr;
  enum class Outside { none, failed, checkpoint };
  std::function<Outside()> outside;
};

struct SuperviseResult {
  std::vector<ChildExit> exits;  // in the order of `pids`
  int first_failure = -1;        // index of the first child that failed on its own (of several found
                                 // failed at once, one killed by a signal before one that exited)
  bool timed_out = false;
  bool interrupted = false;
  SuperviseOptions::Outside outside = SuperviseOptions::Outside::none;  // what options.outside() asked
};

SuperviseResult supervise(const std::vector<pid_t>& pids, const SuperviseOptions& options);

}  // namespace tessera
