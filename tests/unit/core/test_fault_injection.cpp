// TESSERA_FAULT (core/fault_injection.h): a malformed value is refused naming the variable and
// what is wrong; an armed fault for another rank, another point or a later step never fires (a
// fault that fired would stop this test process: the fault matrix, tests/cli/test_fault_matrix.cpp,
// checks that one does).
#include <gtest/gtest.h>

#include <cstdlib>

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

TEST(FaultInjection, OnlyItsRankPointAndStepFire) {
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
  arm_with("1:forward:3:KILL", /*rank=*/0);  // disarmed again before this test ends
  SUCCEED();
}

}  // namespace
}  // namespace tessera
