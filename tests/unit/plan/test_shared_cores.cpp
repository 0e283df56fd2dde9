// Pipelines on shared CPU cores (plan/shared_cores.h) and a send's copying at the core's socket
// rate (device.socket_gbs): the replay against cases solved by hand, the lower bound the search
// prunes by, and the copying on a link slower than the core.
#include <gtest/gtest.h>

#include <string>

#include "parallel/layout_check.h"
#include "parallel/pipeline/schedule_builders.h"
#include "parallel/pipeline/simulate.h"
#include "plan/cluster.h"
#include "plan/cost_model.h"
#include "plan/shared_cores.h"
#include "plan_test_util.h"
#include "test_util.h"
#include "config/config.h"

namespace tessera {
namespace {

using plan::Cluster;

// Four ranks on a CPU node that runs one rank alone twice as fast as four at once.
Cluster shared_node(double slowdown = 2) {
  Cluster c = plan::parse_cluster(test::kPlannerCluster, "test.toml");
  c.device.kind = "cpu";
  c.cluster.shared_slowdown = slowdown;
  return c;
}

pipeline::ActionCosts equal_costs() {
  pipeline::ActionCosts costs;
  costs.f = 1, costs.b = 2, costs.i = 1, costs.w = 1;
  return costs;
}

// One micro-batch through four stages: one rank computes at a time, so every action runs alone,
// at its cost over the node's factor: the step is half the replay at the priced costs.
TEST(SharedCores, OneMicroBatchRunsEachActionAlone) {
  const pipeline::ActionCosts costs = equal_costs();
  const pipeline::Schedule gpipe = pipeline::build_schedule("gpipe", 4, 1, 1, costs);
  const double priced = pipeline::simulate_schedule(gpipe, costs).step_time;
  ASSERT_DOUBLE_EQ(priced, 12);
  EXPECT_NEAR(plan::simulate_on_shared_cores(gpipe, costs, shared_node(), 4).step_time, 6, 0.06);
}

// The pipeline's replicas compute beside it: the same table over 8 ranks of an 8-core node (pp 4
// x dp 2) runs each action with its data-parallel twin, 2 ranks at once: the step is the priced
// one x slowdown(2) / slowdown(8), not x slowdown(1) / slowdown(8).
TEST(SharedCores, ThePipelinesReplicasShareTheNodeToo) {
  const pipeline::ActionCosts costs = equal_costs();
  const pipeline::Schedule gpipe = pipeline::build_schedule("gpipe", 4, 1, 1, costs);
  Cluster node = shared_node();
  node.cluster.devices_per_node = 8;
  const double two = node.cluster.slowdown(2), eight = node.cluster.slowdown(8);
  ASSERT_DOUBLE_EQ(two, 1 + 1.0 / 7);
  EXPECT_NEAR(plan::simulate_on_shared_cores(gpipe, costs, node, 8).step_time, 12 * two / eight, 0.01 * 12);
}

// Many micro-batches: the four ranks compute at once through the pipeline's middle, at the priced
// costs; only its fill and drain run faster. The step lies between a rank's work at the priced
// costs and the priced replay, and nearer the first.
TEST(SharedCores, ManyMicroBatchesRunMostlyAtTheFullNodesRate) {
  const pipeline::ActionCosts costs = equal_costs();
  for (const char* schedule : {"gpipe", "1f1b"}) {
    const pipeline::Schedule table = pipeline::build_schedule(schedule, 4, 32, 1, costs);
    const double priced = pipeline::simulate_schedule(table, costs).step_time;
    const double shared = plan::simulate_on_shared_cores(table, costs, shared_node(), 4).step_time;
    const double work = 32 * 3;
    EXPECT_LT(shared, priced) << schedule;
    EXPECT_GT(shared, 0.97 * work) << schedule;
    EXPECT_LT(shared - work, 0.5 * (priced - work)) << schedule;
  }
}

// Nothing to replay where the cores are not shared: GPUs, and a node whose ranks do not slow each
// other.
TEST(SharedCores, OnlyACpuNodeWhoseRanksSlowEachOtherShares) {
  EXPECT_TRUE(plan::shares_cores(shared_node(), 4));
  EXPECT_FALSE(plan::shares_cores(shared_node(), 1));
  EXPECT_FALSE(plan::shares_cores(shared_node(1), 4));
  Cluster gpu = shared_node();
  gpu.device.kind = "cuda";
  EXPECT_FALSE(plan::shares_cores(gpu, 4));
}

// The search prunes by step_lower_bound: it must hold where the replay runs actions faster than
// their priced costs. And the breakdown still adds up to the step.
TEST(SharedCores, TheLowerBoundHoldsOnSharedCores) {
  const Cluster cluster = shared_node(2.5);
  Config c = test::planner_config();
  c.train.device = "cpu";
  c.model.n_layer = 8;
  int64_t checked = 0;
  for (const char* schedule : {"1f1b", "gpipe", "zbh1", "interleaved"})
    for (const int64_t m : {1, 4, 8}) {
      c.parallel.pp = 4, c.parallel.pp_schedule = schedule, c.train.grad_accum = m;
      c.parallel.pp_virtual = std::string(schedule) == "interleaved" ? 2 : 0;
      try {
        c.check("test");
        const ParallelDims dims(c.parallel, 4, "test");
        check_layout_options(c, dims);
        const double bound = plan::step_lower_bound(c, dims, cluster, plan::price_operations(c, dims, cluster));
        const double step = plan::predict_time(c, dims, cluster).step_s;
        ++checked;
        EXPECT_LE(bound, step * (1 + 1e-12)) << schedule << " m " << m;
        // The breakdown's parts, the critical rank's work as replayed, add up to the step.
        const plan::Prediction p = plan::predict_time(c, dims, cluster);
        EXPECT_NEAR(test::breakdown_sum(p), p.step_s, 1e-9 * p.step_s) << schedule << " m " << m;
      } catch (const Error&) {  // interleaved needs m % pp == 0
      }
    }
  EXPECT_GE(checked, 10);
}

// Two ranks on a two-core CPU node, every core computing, joined by a link far slower than a
// core: at the core's socket rate a send's copying is small and GPipe's step is the link's sends
// one after another (as on any slow link: CostModel.ASlowPipelineLinkCarriesItsSendsOneAfterAnother);
// priced at the link's rate instead (socket_gbs = 0, what files without the key get), each forward
// and each backward would also hold its core for its send's whole time.
TEST(SharedCores, ASendsCopyingTakesTheCoreAtTheSocketRateNotTheLinks) {
  Cluster slow = plan::parse_cluster(test::replaced_text(test::kPlannerCluster, "bandwidth_gbs = 100",
                                                         "bandwidth_gbs = 0.0001"), "slow.toml");
  slow.device.kind = "cpu";
  slow.cluster.devices_per_node = 2;
  Config c = test::planner_config();
  c.train.device = "cpu";
  c.parallel.pp = 2, c.parallel.pp_schedule = "gpipe";
  const ParallelDims dims(c.parallel, 2, "test");
  const double send = 2.0 * 64 * 32 * 4 / 0.0001e9 + 5e-6;  // a micro-batch's float32 activations
  slow.device.socket_gbs = 100;
  const plan::Prediction socket = plan::predict_time(c, dims, slow);
  EXPECT_NEAR(socket.step_s, 8 * send + test::breakdown_term(socket, "optimizer"), 1e-4);
  slow.device.socket_gbs = 0;
  const plan::Prediction link = plan::predict_time(c, dims, slow);
  // Stage 0's first forward holds its core for a send's time before its activations leave, and
  // stage 1's first backward likewise before their gradients do.
  EXPECT_GT(link.step_s, 9.5 * send);
}

}  // namespace
}  // namespace tessera
