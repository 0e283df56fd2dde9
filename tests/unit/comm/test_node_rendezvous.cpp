// The launchers' generations (comm/node_rendezvous.h): who runs after a failure, and the store
// protocol between two launchers in this process.
#include <gtest/gtest.h>

#include <unistd.h>

#include <thread>

#include "comm/node_rendezvous.h"
#include "comm/rendezvous.h"
#include "core/error.h"

namespace tessera::comm {
namespace {

std::map<int, std::pair<int64_t, int64_t>> ranks_of(const Generation& g) {
  std::map<int, std::pair<int64_t, int64_t>> out;
  for (const auto& [node, slot] : g.nodes) out[node] = {slot.first_rank, slot.nproc};
  return out;
}

TEST(NodeGenerations, TheFirstNeedsEveryNodeWithTheSameWorkerCount) {
  const Generation g = first_generation({{0, 2}, {1, 2}, {2, 2}}, 3, 4242);
  EXPECT_TRUE(g.refusal.empty()) << g.refusal;
  EXPECT_EQ(g.world, 6);
  EXPECT_EQ(g.store_port, 4242);
  EXPECT_EQ(ranks_of(g), (std::map<int, std::pair<int64_t, int64_t>>{{0, {0, 2}}, {1, {2, 2}}, {2, {4, 2}}}));
  EXPECT_NE(first_generation({{0, 2}, {2, 2}}, 3, 1).refusal.find("node(s) 1 did not join"), std::string::npos);
  EXPECT_NE(first_generation({{0, 2}, {1, 3}}, 2, 1).refusal.find("node 1's launcher has --nproc 3 and node 0's 2"),
            std::string::npos);
}

TEST(NodeGenerations, ARestartDropsTheFailedWorkerAndLostNodesAndKeepsWholeReplicas) {
  const Generation first = first_generation({{0, 2}, {1, 2}, {2, 2}}, 3, 1);
  const GenerationEnd rank3{1, true, "rank 3 (pid 7) on node 1 killed by signal 9 (SIGKILL)"};

  // Data parallelism alone: node 1 runs one worker fewer; ranks stay contiguous in node order.
  Generation g = next_generation(first, rank3, {0, 1, 2}, 1, 12, 2, "RUN");
  EXPECT_TRUE(g.refusal.empty()) << g.refusal;
  EXPECT_EQ(g.number, 1);
  EXPECT_EQ(g.world, 5);
  EXPECT_EQ(ranks_of(g), (std::map<int, std::pair<int64_t, int64_t>>{{0, {0, 2}}, {1, {2, 1}}, {2, {3, 2}}}));
  EXPECT_EQ(g.announcement,
            "restart 1 of 2: rank 3 (pid 7) on node 1 killed by signal 9 (SIGKILL); continuing from checkpoint step 12 "
            "on 5 workers (parallel.dp 5): node 0 2 workers, node 1 1 worker, node 2 2 workers");

  // Replicas of 2 ranks: 5 workers are cut to 4, taken from the highest node.
  g = next_generation(first, rank3, {0, 1, 2}, 2, 12, 2, "RUN");
  EXPECT_EQ(ranks_of(g), (std::map<int, std::pair<int64_t, int64_t>>{{0, {0, 2}}, {1, {2, 1}}, {2, {3, 1}}}));
  EXPECT_NE(g.announcement.find("on 4 workers (parallel.dp 2)"), std::string::npos) << g.announcement;

  // Node 2's launcher is gone (its host): it is left out and named, and explains node 1's failure
  // (a worker there failed on the lost peer), so node 1 keeps both workers.
  g = next_generation(first, rank3, {0, 1}, 1, 12, 2, "RUN");
  EXPECT_EQ(ranks_of(g), (std::map<int, std::pair<int64_t, int64_t>>{{0, {0, 2}}, {1, {2, 2}}}));
  EXPECT_NE(g.announcement.find("node 2's launcher did not rejoin within parallel.timeout_s"), std::string::npos)
      << g.announcement;

  // A node left with no worker has no slot; the next restart counts from this generation.
  const Generation one_each = next_generation(first_generation({{0, 1}, {1, 1}}, 2, 1), rank3, {0, 1}, 1, 12, 2, "RUN");
  EXPECT_EQ(ranks_of(one_each), (std::map<int, std::pair<int64_t, int64_t>>{{0, {0, 1}}}));
  const Generation second = next_generation(one_each, GenerationEnd{0, true, "rank 0 failed"}, {0}, 1, 20, 2, "RUN");
  EXPECT_EQ(second.number, 2);
  EXPECT_EQ(second.refusal, "no whole replica of 1 rank is left");

  // No checkpoint, no replica, or an interrupt (not restartable: nobody loses a worker).
  EXPECT_EQ(next_generation(first, rank3, {0, 1, 2}, 1, -1, 2, "RUN").refusal,
            "the run has no checkpoint in RUN/checkpoints to continue from");
  EXPECT_EQ(next_generation(first, rank3, {1}, 4, 12, 2, "RUN").refusal, "no whole replica of 4 ranks is left");
  EXPECT_EQ(next_generation(first, GenerationEnd{1, false, "interrupted"}, {0, 1, 2}, 1, 12, 2, "RUN").world, 6);
}

TEST(NodeGenerations, OneNodeSaysWhatItAlwaysSaid) {
  const Generation g = next_generation(first_generation({{0, 3}}, 1, 1), GenerationEnd{0, true, "rank 1 failed"}, {0},
                                       1, 4, 1, "RUN");
  EXPECT_EQ(g.announcement, "restart 1 of 1: rank 1 failed; continuing from checkpoint step 4 on 2 workers (parallel.dp 2)");
}

int free_port() {
  const ListenSocket probe = listen_on("127.0.0.1", 0);
  ::close(probe.fd);
  return probe.port;
}

// Two launchers: node 1 connects before node 0 serves (it retries), both join, node 0 publishes
// what it collected, node 1 reads it; the first recorded end wins for both, and both see it.
TEST(NodeRendezvous, TwoLaunchersAgreeOnAGenerationAndOnHowItEnded) {
  const int port = free_port();
  const auto timeout = std::chrono::milliseconds(10000);
  Generation seen;
  GenerationEnd second_end;
  std::thread node1([&] {
    NodeRendezvous one("127.0.0.1", port, 1, timeout);
    one.join(0, 2);
    seen = one.await(0);
    while (!one.ended(0)) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    second_end = one.end(0, GenerationEnd{1, true, "secondary"});
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  NodeRendezvous zero("127.0.0.1", port, 0, timeout);
  zero.join(0, 2);
  const std::map<int, int64_t> joined = zero.collect(0, {0, 1});
  EXPECT_EQ(joined, (std::map<int, int64_t>{{0, 2}, {1, 2}}));
  Generation g = first_generation(joined, 2, 5555);
  zero.publish(g);
  EXPECT_FALSE(zero.ended(0));
  const GenerationEnd first = zero.end(0, GenerationEnd{0, true, "rank 1 (pid 9) on node 0 exited with code 1"});
  node1.join();
  EXPECT_EQ(first.failure, "rank 1 (pid 9) on node 0 exited with code 1");
  EXPECT_EQ(second_end.node, 0);
  EXPECT_EQ(second_end.failure, first.failure);
  EXPECT_EQ(ranks_of(seen), ranks_of(g));
  EXPECT_EQ(seen.store_port, 5555);
  EXPECT_EQ(seen.world, 4);

  // A node that never joins is missing after the timeout, not waited for ever.
  NodeRendezvous impatient("127.0.0.1", free_port(), 0, std::chrono::milliseconds(200));
  impatient.join(3, 0);
  EXPECT_EQ(impatient.collect(3, {0, 1}), (std::map<int, int64_t>{{0, 0}}));
}

}  // namespace
}  // namespace tessera::comm
