// supervise() (core/subprocess.h) stopped from outside: a launcher whose run failed on another
// node stops its own children at once, and says why; of children found failed together, the one
// killed by a signal is named.
#include <gtest/gtest.h>

#include <signal.h>

#include <chrono>
#include <thread>

#include "core/subprocess.h"

namespace tessera {
namespace {

TEST(Supervise, AFailureElsewhereStopsEveryChildAsAFailureWould) {
  std::vector<pid_t> children;
  ChildSpec sleeper;
  sleeper.argv = {"/bin/sleep", "30"};
  for (int i = 0; i < 2; ++i) children.push_back(spawn(sleeper));
  const auto start = std::chrono::steady_clock::now();
  int polls = 0;
  SuperviseOptions options;
  options.deadline_s = 20;
  options.grace_s = 1;
  options.outside = [&] { return ++polls > 5 ? SuperviseOptions::Outside::failed : SuperviseOptions::Outside::none; };
  const SuperviseResult result = supervise(children, options);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(result.outside, SuperviseOptions::Outside::failed);
  EXPECT_FALSE(result.timed_out);
  EXPECT_EQ(result.first_failure, -1);  // nobody here failed on its own
  for (const ChildExit& exit : result.exits) {
    EXPECT_TRUE(exit.stopped_by_supervisor);
    EXPECT_EQ(exit.signal, SIGTERM) << exit.describe();
  }
  EXPECT_LT(seconds, 5);
  EXPECT_EQ(polls, 6);  // not polled again once stopping
}

// A worker killed by a signal and a peer that exited with an error on losing it, both gone before
// the launcher looks: the killed one is the failure, although the other comes first in the list.
TEST(Supervise, OfChildrenFoundFailedTogetherTheOneKilledByASignalIsNamed) {
  ChildSpec erred, killed;
  erred.argv = {"/bin/sh", "-c", "exit 1"};
  killed.argv = {"/bin/sh", "-c", "kill -9 $$"};
  const std::vector<pid_t> children = {spawn(erred), spawn(killed)};
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // both have ended before the first sweep
  SuperviseOptions options;
  options.deadline_s = 20;
  const SuperviseResult result = supervise(children, options);
  ASSERT_EQ(result.first_failure, 1);
  EXPECT_EQ(result.exits[1].signal, SIGKILL) << result.exits[1].describe();
  EXPECT_EQ(result.exits[0].code, 1) << result.exits[0].describe();
  EXPECT_FALSE(result.exits[0].stopped_by_supervisor);
}

}  // namespace
}  // namespace tessera
