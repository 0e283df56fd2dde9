// TESSERA_FAULT (core/fault_injection.h): a malformed value is refused naming the variable and
// what is wrong; an armed fault fires at its rank, point and step with its signal, and one for
// another rank, another point or a later step never fires. The firing cases run in a forked child
// watched with WUNTRACED, so a fault that stops (SIGSTOP) or kills its process is seen at once
// instead of hanging or ending this test program.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <functional>

#include "core/fault_injection.h"
#include "test_util.h"

namespace tessera {
namespace {

void arm_with(const char* value, int64_t rank = 1) {
  ::setenv("TESSERA_FAULT", value, 1);
  fault::arm(rank);
  ::unsetenv("TESSERA_FAULT");
}

TEST(FaultInjection, MalformedValuesAreRefusedByName) {
  EXPECT_TRUE(test::throws_naming([] { arm_with("1:forward:3"); }, {"TESSERA_FAULT=1:forward:3", "RANK:POINT:STEP:SIGNAL"}));
  EXPECT_TRUE(test::throws_naming([] { arm_with("x:forward:3:KILL"); }, {"RANK 'x' is not a whole number"}));
  EXPECT_TRUE(test::throws_naming([] { arm_with("1:fwd:3:KILL"); }, {"unknown point 'fwd'"}));
  EXPECT_TRUE(test::throws_naming([] { arm_with("1:Pp.send:3:KILL"); }, {"unknown point 'Pp.send'"}));
  EXPECT_TRUE(test::throws_naming([] { arm_with("1:pp.sned:3:KILL"); }, {"unknown point 'pp.sned'"}));
  EXPECT_TRUE(test::throws_naming([] { arm_with("1:forward:0:KILL"); }, {"STEP counts from 1"}));
  EXPECT_TRUE(test::throws_naming([] { arm_with("1:forward:3:TERM"); }, {"SIGNAL 'TERM' is neither KILL nor STOP"}));
}

// How a forked child running `body` then _exit(0) ended: "exited 0", "killed by 9", "stopped by 19".
std::string end_of_child(const std::function<void()>& body) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    body();
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(pid, &status, WUNTRACED);
  if (WIFSTOPPED(status)) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    return "stopped by " + std::to_string(WSTOPSIG(status));
  }
  if (WIFSIGNALED(status)) return "killed by " + std::to_string(WTERMSIG(status));
  return "exited " + std::to_string(WEXITSTATUS(status));
}

TEST(FaultInjection, FiresAtItsRankPointAndStepWithItsSignal) {
  EXPECT_EQ(end_of_child([] {
              arm_with("1:forward:3:KILL");
              fault::at_step(3);
              fault::point("forward");
            }),
            "killed by " + std::to_string(SIGKILL));
  EXPECT_EQ(end_of_child([] {
              arm_with("1:*.send:3:STOP");
              fault::at_step(4);  // "in step STEP or later"
              fault::comm_point("pp_down/0,1", "send of 4096 bytes to rank 0");
            }),
            "stopped by " + std::to_string(SIGSTOP));
}

TEST(FaultInjection, OnlyItsRankPointAndStepFire) {
  EXPECT_EQ(end_of_child([] {
              arm_with("1:forward:3:KILL", /*rank=*/0);  // another rank's fault
              fault::at_step(5);
              fault::point("forward");
              arm_with("1:*.send:3:STOP");  // this rank's, at a later step and another point
              fault::at_step(2);
              fault::comm_point("pp_down/0,1", "send of 4096 bytes to rank 0");
              fault::at_step(3);
              fault::point("backward");
              fault::comm_point("world", "recv of 4096 bytes from rank 0");
              fault::comm_point("world", "all_reduce of 4096 bytes");
            }),
            "exited 0");
}

}  // namespace
}  // namespace tessera
