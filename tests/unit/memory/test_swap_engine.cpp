// The swap engine's executor and partitioner without a model. The executor runs plans whose
// actions are sleeps of fixed duration (on 2 shared cores, compute would fight the copy threads
// and the timings would measure the machine): its measured timeline must show every load but the
// first hidden behind compute when the link allows it, and the replay's step time. The
// partitioner must never exceed the budget (property test over random sizes and budgets, against
// an exhaustive search of small models) and refuse, naming the block and the bytes, a budget too
// small for a block.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <random>
#include <thread>

#include "core/error.h"
#include "memory/swap/host_home.h"
#include "memory/swap/swap_executor.h"
#include "memory/swap/swap_partition.h"
#include "memory/swap/swap_plan.h"
#include "memory/swap/swap_simulate.h"
#include "memory/swap/swap_timeline.h"
#include "test_util.h"

namespace tessera::swap {
namespace {

void sleep_s(double s) { std::this_thread::sleep_for(std::chrono::duration<double>(s)); }

SwapPlan synthetic(int64_t subs, double load_s, double forward_s) {
  SwapPlan p;
  for (int64_t i = 0; i < subs; ++i) {
    SubModel s;
    s.first = i;
    s.end = i + 1;
    s.parameter_bytes = s.gradient_bytes = load_s;  // at 1 byte/s: a load lasts load_s
    s.forward_s = forward_s;
    s.backward_s = 2 * forward_s;
    s.optim_s = 0.005;
    p.subs.push_back(s);
  }
  p.ends.parameter_bytes = p.ends.gradient_bytes = 0.002;
  p.device_budget_bytes = 1e9;
  p.bandwidth = 1;
  p.micro_batches = 2;
  p.defer_optim = true;
  return build_swap_plan(p);
}

// A home in host memory whose movements are jobs given by the test: job(op, sub) for LOAD,
// STORE_GRAD and EVICT of sub-model `sub` (kEnds for the ends) of a model of `subs`.
class FakeHome final : public HostHome {
 public:
  using Jobs = std::function<std::function<void()>(Op op, int64_t sub)>;
  FakeHome(int64_t subs, Jobs jobs) : HostHome(static_cast<size_t>(subs) + 1), subs_(subs), jobs_(std::move(jobs)) {}
  ~FakeHome() override { stop(); }

 protected:
  std::function<void()> load_job(size_t unit) override { return jobs_(Op::Load, sub(unit)); }
  std::function<void()> store_job(size_t unit) override { return jobs_(Op::StoreGrad, sub(unit)); }
  void evict(size_t unit) override { jobs_(Op::Evict, sub(unit))(); }

 private:
  int64_t sub(size_t unit) const { return static_cast<int64_t>(unit) == subs_ ? kEnds : static_cast<int64_t>(unit); }
  int64_t subs_;
  Jobs jobs_;
};

// Runs `plan` with every action a sleep of its planned duration.
std::vector<TimedAction> run_synthetic(const SwapPlan& plan) {
  FakeHome home(plan.size(), [&](Op op, int64_t sub) -> std::function<void()> {
    const SubModel& s = plan.sub(sub);
    switch (op) {
      case Op::Load: return [d = s.parameter_bytes / plan.bandwidth] { sleep_s(d); };
      case Op::StoreGrad: return [d = s.gradient_bytes / plan.bandwidth] { sleep_s(d); };
      default: return [] {};
    }
  });
  SwapExecutor executor(home);
  SwapWork work;
  work.compute = [&](const Action& a) {
    const SubModel& s = plan.sub(a.sub);
    sleep_s(a.op == Op::ComputeF ? s.forward_s : s.backward_s);
  };
  work.update = [&](const Action& a) -> std::function<void()> { return [d = plan.sub(a.sub).optim_s] { sleep_s(d); }; };
  int stored = 0;
  work.gradients_stored = [&] { ++stored; };
  const Timeline timeline = executor.run(plan, work);
  EXPECT_EQ(stored, 1);
  executor.settle();
  return *timeline;
}

TEST(SwapExecutor, EveryLoadButTheFirstOverlapsACompute) {
  // Loads of 10 ms under forwards of 25 ms: the compute stream waits for the first load only.
  const SwapPlan plan = synthetic(4, 0.010, 0.025);
  const auto timeline = run_synthetic(plan);
  ASSERT_EQ(timeline.size(), plan.actions.size());
  double first_load = 0, compute_end = -1, worst_gap = 0;
  for (const TimedAction& t : timeline) {
    if (t.action.op == Op::Load && first_load == 0 && t.action.sub == 0) first_load = t.end;
    if (t.action.op != Op::ComputeF && t.action.op != Op::ComputeB) continue;
    if (compute_end >= 0) worst_gap = std::max(worst_gap, t.start - compute_end);
    compute_end = t.end;
  }
  // Between computes only the executor's own bookkeeping (thread hand-offs): no load waited for.
  EXPECT_LT(worst_gap, 0.004);
  EXPECT_LT(exposed_load(timeline), first_load + 0.004);
  // The measured step against the replay of the same plan.
  const SwapTimeline planned = simulate_swap_plan(plan);
  double measured = 0;
  for (const TimedAction& t : timeline) measured = std::max(measured, t.end);
  EXPECT_NEAR(measured, planned.step_time, 0.15 * planned.step_time);
  std::printf("measured: synthetic swap step %.1f ms, replay %.1f ms, exposed load %.1f ms (first load %.1f ms)\n",
              1000 * measured, 1000 * planned.step_time, 1000 * exposed_load(timeline), 1000 * first_load);
}

TEST(SwapExecutor, DeferredUpdatesRunOnIntoTheNextStepWhoseLoadsWaitForThem) {
  // Updates of 30 ms per sub-model after the clipping norm: run() returns before they finish, and
  // the next step's LOAD of each sub-model starts only after that sub-model's update ended.
  SwapPlan plan = synthetic(3, 0.002, 0.005);
  for (SubModel& s : plan.subs) s.optim_s = 0.030;
  plan = build_swap_plan(plan);
  std::vector<std::pair<Action, std::chrono::steady_clock::time_point>> starts, ends;
  std::mutex mutex;
  auto recorded = [&](Action a) -> std::function<void()> {
    return [&, a] {
      {
        std::lock_guard<std::mutex> lock(mutex);
        starts.emplace_back(a, std::chrono::steady_clock::now());
      }
      sleep_s(a.op == Op::Optim && a.sub != kEnds ? 0.030 : 0.002);
      std::lock_guard<std::mutex> lock(mutex);
      ends.emplace_back(a, std::chrono::steady_clock::now());
    };
  };
  FakeHome home(plan.size(), [&](Op op, int64_t sub) { return recorded(Action{op, sub}); });
  SwapExecutor executor(home);
  SwapWork work;
  work.compute = [](const Action&) { sleep_s(0.005); };
  work.update = [&](const Action& a) { return recorded(a); };
  work.gradients_stored = [] {};
  executor.run(plan, work);
  size_t updates_done_at_return;
  {
    std::lock_guard<std::mutex> lock(mutex);
    updates_done_at_return = std::count_if(ends.begin(), ends.end(), [](const auto& e) { return e.first.op == Op::Optim; });
  }
  EXPECT_LT(updates_done_at_return, 4u);  // the ends' and three sub-models' updates: not all done
  const size_t first_run = starts.size();
  executor.run(plan, work);
  executor.settle();
  std::lock_guard<std::mutex> lock(mutex);
  for (int64_t sub = 0; sub < 3; ++sub) {
    std::chrono::steady_clock::time_point updated{}, reloaded{};
    for (const auto& [a, t] : ends)
      if (a.op == Op::Optim && a.sub == sub && updated.time_since_epoch().count() == 0) updated = t;
    for (size_t k = first_run; k < starts.size(); ++k)
      if (starts[k].first.op == Op::Load && starts[k].first.sub == sub && reloaded.time_since_epoch().count() == 0)
        reloaded = starts[k].second;
    EXPECT_GE(reloaded, updated) << "sub-model " << sub << " reloaded before its update ended";
  }
}

TEST(SwapExecutor, SlowLoadsAreExposedAndJobFailuresSurface) {
  // Loads of 40 ms over forwards of 10 ms: the compute waits about 30 ms at each forward.
  const auto timeline = run_synthetic(synthetic(4, 0.040, 0.010));
  EXPECT_GT(exposed_load(timeline), 3 * 0.025);
  // A job that throws is rethrown by run() after the jobs in flight finished.
  const SwapPlan plan = synthetic(3, 0.001, 0.001);
  bool failing = true;
  FakeHome home(plan.size(), [&](Op op, int64_t sub) -> std::function<void()> {
    if (failing && op == Op::StoreGrad && sub == 1) return [] { fail("store of sub-model 1 failed"); };
    return [] {};
  });
  SwapExecutor executor(home);
  SwapWork work;
  work.compute = [](const Action&) {};
  work.update = [](const Action&) -> std::function<void()> { return [] {}; };
  work.gradients_stored = [] {};
  EXPECT_TRUE(test::throws_naming([&] { executor.run(plan, work); }, {"store of sub-model 1 failed"}));
  // Every unit was released, and the same executor runs the next step afresh.
  for (size_t u = 0; u < home.units(); ++u) EXPECT_FALSE(home.materialized(u)) << u;
  failing = false;
  EXPECT_NO_THROW(executor.run(plan, work));
  executor.settle();
  for (size_t u = 0; u < home.units(); ++u) EXPECT_FALSE(home.materialized(u)) << u;
}

// n blocks alike: forward 10 ms, backward 20 ms.
std::vector<SubModel> equal_blocks(int64_t n, double parameter_bytes, double activation_bytes) {
  std::vector<SubModel> blocks(static_cast<size_t>(n));
  for (int64_t l = 0; l < n; ++l) {
    SubModel& b = blocks[static_cast<size_t>(l)];
    b.first = l;
    b.end = l + 1;
    b.parameter_bytes = b.gradient_bytes = parameter_bytes;
    b.activation_bytes = activation_bytes;
    b.forward_s = 0.01;
    b.backward_s = 0.02;
  }
  return blocks;
}

// Every contiguous cut of n blocks, as boundaries [0, ..., n].
std::vector<std::vector<int64_t>> every_cut(int64_t n) {
  std::vector<std::vector<int64_t>> cuts;
  for (int64_t mask = 0; mask < (int64_t{1} << (n - 1)); ++mask) {
    std::vector<int64_t> boundaries{0};
    for (int64_t l = 1; l < n; ++l)
      if (mask & (int64_t{1} << (l - 1))) boundaries.push_back(l);
    boundaries.push_back(n);
    cuts.push_back(boundaries);
  }
  return cuts;
}

std::vector<SubModel> random_blocks(std::mt19937& rng, int64_t n) {
  std::uniform_real_distribution<double> bytes(1, 10), act(0, 2), time(0.5, 2);
  std::vector<SubModel> blocks;
  for (int64_t l = 0; l < n; ++l) {
    SubModel b;
    b.first = l;
    b.end = l + 1;
    b.parameter_bytes = b.gradient_bytes = bytes(rng);
    b.activation_bytes = act(rng);
    b.forward_s = time(rng);
    b.backward_s = 2 * b.forward_s;
    blocks.push_back(b);
  }
  return blocks;
}

TEST(SwapPartition, NeverExceedsTheBudgetAndNearsTheExhaustiveBest) {
  std::mt19937 rng(7);
  int found = 0, refused = 0, refused_fitting = 0;
  double worst_ratio = 1;
  for (int trial = 0; trial < 150; ++trial) {
    const int64_t n = 1 + trial % 8;
    const auto blocks = random_blocks(rng, n);
    SwapPlan shape;
    shape.ends.parameter_bytes = shape.ends.gradient_bytes = 1;
    shape.device_budget_bytes = std::uniform_real_distribution<double>(10, 80)(rng);
    shape.bandwidth = std::uniform_real_distribution<double>(1, 20)(rng);
    shape.micro_batches = 1 + trial % 2;
    shape.defer_optim = trial % 3 == 0;
    // Every contiguous cut, replayed: the best valid step time (infinity: none fits).
    double best = std::numeric_limits<double>::infinity();
    for (const std::vector<int64_t>& boundaries : every_cut(n)) {
      try {
        best = std::min(best, simulate_swap_plan(cut_swap_plan(blocks, shape, boundaries)).step_time);
      } catch (const Error&) {
      }
    }
    try {
      const SwapPlan plan = partition_swap_plan(blocks, shape);
      validate_swap_plan(plan);  // within the budget at every action
      EXPECT_LE(occupancy(plan).peak, shape.device_budget_bytes);
      const double ratio = simulate_swap_plan(plan).step_time / best;
      worst_ratio = std::max(worst_ratio, ratio);
      ++found;
    } catch (const Error& e) {
      ++refused;
      if (best < std::numeric_limits<double>::infinity()) ++refused_fitting;
      EXPECT_TRUE(std::string(e.what()).find("memory.device_budget_gb") != std::string::npos) << e.what();
    }
  }
  std::printf("measured: partitioner found %d plans, refused %d (%d of which some cut fits); worst step time %.3fx "
              "the exhaustive best\n", found, refused, refused_fitting, worst_ratio);
  EXPECT_GT(found, 100);
  EXPECT_EQ(refused_fitting, 0);  // refused only when no contiguous cut fits at all
  EXPECT_LT(worst_ratio, 1.10);
}

TEST(SwapPartition, CutsThatNearTieOnTimeAreDecidedByTheirPeak) {
  // Four equal blocks, a budget that holds them all and a link that hides every load: one
  // sub-model and four run within a fraction of a percent of each other, and their peaks differ
  // fourfold in parameters. The partitioner takes the least peak among the cuts within
  // kPeakTolerance of the fastest (every cut enumerated here), not whichever is fastest by a hair.
  const std::vector<SubModel> blocks = equal_blocks(4, 8 << 20, 1 << 20);
  SwapPlan shape;
  shape.device_budget_bytes = 256 << 20;
  shape.bandwidth = 1e12;
  shape.micro_batches = 2;
  double fastest = std::numeric_limits<double>::infinity();
  std::vector<std::pair<double, double>> cuts;  // (step, peak) of every contiguous cut
  for (const std::vector<int64_t>& boundaries : every_cut(4)) {
    const SwapPlan plan = cut_swap_plan(blocks, shape, boundaries);
    cuts.emplace_back(simulate_swap_plan(plan).step_time, occupancy(plan).peak);
    fastest = std::min(fastest, cuts.back().first);
  }
  double least = std::numeric_limits<double>::infinity(), most = 0;
  for (const auto& [step, peak] : cuts)
    if (step <= fastest * (1 + kPeakTolerance)) {
      least = std::min(least, peak);
      most = std::max(most, peak);
    }
  ASSERT_GT(most, 1.5 * least) << "the near-ties must differ in memory for this test to choose";
  const SwapPlan chosen = partition_swap_plan(blocks, shape);
  EXPECT_LE(simulate_swap_plan(chosen).step_time, fastest * (1 + kPeakTolerance));
  EXPECT_DOUBLE_EQ(occupancy(chosen).peak, least);
}

TEST(SwapPartition, RefusesABudgetTooSmallForABlockNamingItAndTheBytes) {
  std::vector<SubModel> blocks = equal_blocks(3, 64 << 20, 16 << 20);
  blocks[1].parameter_bytes = blocks[1].gradient_bytes = 256 << 20;  // the big one
  SwapPlan shape;
  shape.device_budget_bytes = 400 << 20;
  shape.bandwidth = 1e9;
  EXPECT_TRUE(test::throws_naming([&] { partition_swap_plan(blocks, shape); },
                                  {"memory.device_budget_gb", "block 1", "544.0 MiB", "parameters 256.0 MiB"}));
  shape.device_budget_bytes = 1024 << 20;
  const SwapPlan plan = partition_swap_plan(blocks, shape);
  EXPECT_LE(occupancy(plan).peak, shape.device_budget_bytes);
}

}  // namespace
}  // namespace tessera::swap
