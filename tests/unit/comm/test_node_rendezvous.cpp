// The launchers' generations (comm/node_rendezvous.h): who runs after a failure, and the store
// protocol between two launchers in this process.
#include <gtest/gtest.h>

#include <unistd.h>

#include <set>
#include <thread>

#include "comm/node_rendezvous.h"
#include "comm/rendezvous.h"
#include "core/error.h"
#include "store_port.h"

namespace tessera::comm {
namespace {

std::map<int, std::pair<int64_t, int64_t>> ranks_of(const Generation& g) {
  std::map<int, std::pair<int64_t, int64_t>> out;
  for (const auto& [node, slot] : g.nodes) out[node] = {slot.first_rank, slot.nproc};
  return out;
}

// Each node of `nodes` joined (its worker count does not matter to a node the generation had).
std::map<int, int64_t> joined(const std::set<int>& nodes) {
  std::map<int, int64_t> out;
  for (int node : nodes) out[node] = 0;
  return out;
}

RestartPolicy policy(int64_t model_parallel, int64_t max_restarts) {
  return RestartPolicy{model_parallel, max_restarts, "RUN"};
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
  const GenerationEnd rank3{1, true, false, "rank 3 (pid 7) on node 1 killed by signal 9 (SIGKILL)"};

  // Data parallelism alone: node 1 runs one worker fewer; ranks stay contiguous in node order.
  Generation g = next_generation(first, rank3, joined({0, 1, 2}), policy(1, 2), 12);
  EXPECT_TRUE(g.refusal.empty()) << g.refusal;
  EXPECT_EQ(g.number, 1);
  EXPECT_EQ(g.world, 5);
  EXPECT_EQ(ranks_of(g), (std::map<int, std::pair<int64_t, int64_t>>{{0, {0, 2}}, {1, {2, 1}}, {2, {3, 2}}}));
  EXPECT_EQ(g.announcement,
            "restart 1 of 2: rank 3 (pid 7) on node 1 killed by signal 9 (SIGKILL); continuing from checkpoint step 12 "
            "on 5 workers (parallel.dp 5): node 0 2 workers, node 1 1 worker, node 2 2 workers");

  // Replicas of 2 ranks: 5 workers are cut to 4, taken from the highest node.
  g = next_generation(first, rank3, joined({0, 1, 2}), policy(2, 2), 12);
  EXPECT_EQ(ranks_of(g), (std::map<int, std::pair<int64_t, int64_t>>{{0, {0, 2}}, {1, {2, 1}}, {2, {3, 1}}}));
  EXPECT_NE(g.announcement.find("on 4 workers (parallel.dp 2)"), std::string::npos) << g.announcement;

  // Node 2's launcher is gone (its host): it is left out and named, and explains node 1's failure
  // (a worker there failed on the lost peer), so node 1 keeps both workers.
  g = next_generation(first, rank3, joined({0, 1}), policy(1, 2), 12);
  EXPECT_EQ(ranks_of(g), (std::map<int, std::pair<int64_t, int64_t>>{{0, {0, 2}}, {1, {2, 2}}}));
  EXPECT_NE(g.announcement.find("node 2's launcher did not rejoin within parallel.timeout_s"), std::string::npos)
      << g.announcement;

  // A node left with no worker has no slot; the next restart counts from this generation.
  const Generation one_each = next_generation(first_generation({{0, 1}, {1, 1}}, 2, 1), rank3, joined({0, 1}), policy(1, 2), 12);
  EXPECT_EQ(ranks_of(one_each), (std::map<int, std::pair<int64_t, int64_t>>{{0, {0, 1}}}));
  const Generation second = next_generation(one_each, GenerationEnd{0, true, false, "rank 0 failed"}, joined({0}), policy(1, 2), 20);
  EXPECT_EQ(second.number, 2);
  EXPECT_EQ(second.restarts, 2);
  EXPECT_EQ(second.refusal, "no whole replica of 1 rank is left");

  // No checkpoint, no replica, or an interrupt (not restartable: nobody loses a worker).
  EXPECT_EQ(next_generation(first, rank3, joined({0, 1, 2}), policy(1, 2), -1).refusal,
            "the run has no checkpoint in RUN/checkpoints to continue from");
  EXPECT_EQ(next_generation(first, rank3, joined({1}), policy(4, 2), 12).refusal, "no whole replica of 4 ranks is left");
  EXPECT_EQ(next_generation(first, GenerationEnd{1, false, false, "interrupted"}, joined({0, 1, 2}), policy(1, 2), 12).world, 6);
}

TEST(NodeGenerations, OneNodeSaysWhatItAlwaysSaid) {
  const Generation g = next_generation(first_generation({{0, 3}}, 1, 1), GenerationEnd{0, true, false, "rank 1 failed"},
                                       joined({0}), policy(1, 1), 4);
  EXPECT_EQ(g.announcement, "restart 1 of 1: rank 1 failed; continuing from checkpoint step 4 on 2 workers (parallel.dp 2)");
}

// A node whose host came back rejoins with the workers it brings; nobody loses one (no worker
// failed), and the announcement counts no failure.
TEST(NodeGenerations, ARejoiningNodeBringsItsWorkers) {
  const Generation first = first_generation({{0, 2}, {1, 2}}, 2, 1);
  const Generation alone = next_generation(first, GenerationEnd{0, true, false, "rank 0 failed"}, joined({0}),
                                           policy(1, 2), 10);
  ASSERT_EQ(ranks_of(alone), (std::map<int, std::pair<int64_t, int64_t>>{{0, {0, 2}}}));
  const GenerationEnd back{1, true, true, "node 1's launcher rejoined"};
  const Generation g = next_generation(alone, back, {{0, 0}, {1, 2}}, policy(1, 2), 14);
  EXPECT_EQ(g.number, 2);
  EXPECT_EQ(alone.restarts, 1);
  EXPECT_EQ(g.restarts, 1);  // a return is not a restart: every launcher reads the count here
  EXPECT_EQ(ranks_of(g), (std::map<int, std::pair<int64_t, int64_t>>{{0, {0, 2}}, {1, {2, 2}}}));
  EXPECT_EQ(g.announcement, "node 1's launcher rejoined; continuing from checkpoint step 14 on 4 workers (parallel.dp 4): "
                            "node 0 2 workers, node 1 2 workers");
  // Replicas of 3: the rejoining node's workers beyond whole replicas stay idle.
  EXPECT_EQ(next_generation(alone, back, {{0, 0}, {1, 2}}, policy(3, 2), 14).world, 3);
}

// Two launchers: node 1 connects before node 0 serves (it retries), both join, node 0 publishes
// what it collected, node 1 reads it; the first recorded end wins for both, and both see it.
TEST(NodeRendezvous, TwoLaunchersAgreeOnAGenerationAndOnHowItEnded) {
  const int port = test::store_port();
  const auto timeout = std::chrono::milliseconds(10000);
  Generation seen;
  GenerationEnd second_end;
  std::thread node1([&] {
    NodeRendezvous one("127.0.0.1", port, 1, timeout);
    EXPECT_FALSE(one.current().has_value());  // not late: generation 0 needs this node
    one.join(0, 2);
    seen = one.await(0);
    while (!one.ended(0)) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    second_end = one.end(0, GenerationEnd{1, true, false, "secondary"});
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  NodeRendezvous zero("127.0.0.1", port, 0, timeout);
  zero.join(0, 2);
  const std::map<int, int64_t> both = zero.collect(0, {0, 1}, 2);
  EXPECT_EQ(both, (std::map<int, int64_t>{{0, 2}, {1, 2}}));
  Generation g = first_generation(both, 2, 5555);
  zero.publish(g);
  EXPECT_EQ(zero.current(), std::optional<int64_t>(0));
  EXPECT_FALSE(zero.ended(0).has_value());
  const GenerationEnd first = zero.end(0, GenerationEnd{0, true, false, "rank 1 (pid 9) on node 0 exited with code 1"});
  node1.join();
  EXPECT_EQ(first.failure, "rank 1 (pid 9) on node 0 exited with code 1");
  EXPECT_EQ(second_end.node, 0);
  EXPECT_EQ(second_end.failure, first.failure);
  EXPECT_EQ(ranks_of(seen), ranks_of(g));
  EXPECT_EQ(seen.store_port, 5555);
  EXPECT_EQ(seen.world, 4);

  // A late launcher joins the next generation and asks for it; node 0 sees who asked.
  EXPECT_EQ(zero.growth_requested(1), -1);
  NodeRendezvous late("127.0.0.1", port, 1, timeout);
  EXPECT_EQ(late.current(), std::optional<int64_t>(0));
  late.join(2, 3);
  late.request_growth(1);
  EXPECT_EQ(zero.growth_requested(1), 1);
  // Node 0 waits for the nodes it had and takes any other that joined by then.
  zero.join(2, 0);
  EXPECT_EQ(zero.collect(2, {0}, 2), (std::map<int, int64_t>{{0, 0}, {1, 3}}));

  // A node that never joins is missing after the timeout, not waited for ever.
  NodeRendezvous impatient("127.0.0.1", test::store_port(), 0, std::chrono::milliseconds(200));
  impatient.join(3, 0);
  EXPECT_EQ(impatient.collect(3, {0, 1}, 2), (std::map<int, int64_t>{{0, 0}}));
}

}  // namespace
}  // namespace tessera::comm
