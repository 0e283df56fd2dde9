// The rank zygote: how a multi-process test binary (dist_test.h) starts its ranks without paying
// for a fresh process each time. Loading libtorch costs about 0.27 s of CPU per process (its
// operators' registration, before main), and the equivalence harness alone starts 385 ranks per
// `make test`; a rank forked from a copy of the binary that has loaded it already starts in a few
// milliseconds.
//
// How. start_rank_zygote(), called first in main() (test_main.cpp) while the process has one
// thread, makes the test process a child subreaper and forks the zygote: a copy that stays
// single-threaded, runs no test and no torch op, and waits for requests on a socket pair. For
// spawn_rank(spec) the zygote forks twice; the middle process exits at once, so the rank is
// reparented to the test process (the subreaper) and is its child as spawn()'s would be: supervise()
// waits on it, signals reach it, and it dies with the test process (PR_SET_PDEATHSIG, set once it
// is reparented). The rank applies what exec would have: spec.env over the environment, its output
// file as stdout and stderr, spec.inherit_fd (passed over the socket) at the same number, its own
// process group; then it returns from start_rank_zygote() with spec.argv and main() goes on as in a
// fresh process (gtest initialised from that argv, one intra-op thread, seed 0).
//
// Differences from an exec'd rank: the libraries' static initialisers ran once, in the test
// process, with its environment (the variables spawn_rank sets, RANK, MASTER_PORT,
// TESSERA_TEST_RANK..., are all read later); the address-space layout is the test process's.
// Without a zygote spawn_rank() is spawn(): with TESSERA_TEST_EXEC_RANKS=1 in the environment, and
// in the sanitizer builds (ThreadSanitizer's runtime keeps a thread of its own, which makes a fork
// without exec unsafe; the AddressSanitizer build keeps the exec path its runs were checked on).
//
// Invariants: the zygote is forked before anything else in main(); it never runs test code; a rank
// is returned to spawn_rank's caller only once it is the test process's child.
#pragma once

#include <sys/types.h>

#include "core/subprocess.h"

namespace tessera::test {

// In the test process: starts the zygote (or nothing, see above) and returns. In a rank it
// started: returns with argc and argv replaced by the rank's.
void start_rank_zygote(int& argc, char**& argv);

// Starts spec (spec.argv[0] must be this binary) as a child of this process, as spawn() does.
pid_t spawn_rank(const ChildSpec& spec);

// Whether this build and environment start ranks from a zygote (not a sanitizer build, not
// TESSERA_TEST_EXEC_RANKS=1); where they do, the zygote failing to start is reported on stderr.
bool rank_zygote_wanted();
// In the test process: whether its zygote runs. In a rank: whether the zygote started it.
bool rank_zygote_running();
bool forked_rank();

}  // namespace tessera::test
