// ATOM swap plans as data: the built order (prefetch, the last sub-model resident across the turn),
// the device occupancy it implies, the validator's refusals, and the replay's overlap.
#include <gtest/gtest.h>

#include <algorithm>

#include "memory/swap/swap_plan.h"
#include "memory/swap/swap_simulate.h"
#include "test_util.h"

namespace tessera::swap {
namespace {

std::vector<SubModel> equal_subs(int64_t n, double params, double activations, double forward_s) {
  std::vector<SubModel> subs;
  for (int64_t i = 0; i < n; ++i) {
    SubModel s;
    s.first = i;
    s.end = i + 1;
    s.parameter_bytes = params;
    s.gradient_bytes = params;
    s.activation_bytes = activations;
    s.forward_s = forward_s;
    s.backward_s = 2 * forward_s;
    s.optim_s = forward_s;
    subs.push_back(s);
  }
  return subs;
}

SwapPlan plan_of(std::vector<SubModel> subs, double budget, double bandwidth, int64_t micro_batches = 1,
                 bool defer_optim = false) {
  SwapPlan p;
  p.subs = std::move(subs);
  p.device_budget_bytes = budget;
  p.bandwidth = bandwidth;
  p.micro_batches = micro_batches;
  p.defer_optim = defer_optim;
  return build_swap_plan(p);
}

int64_t count(const SwapPlan& p, Op op, int64_t sub) {
  return std::count_if(p.actions.begin(), p.actions.end(), [&](const Action& a) { return a.op == op && a.sub == sub; });
}

int64_t position(const SwapPlan& p, Action a) {
  for (size_t k = 0; k < p.actions.size(); ++k)
    if (p.actions[k] == a) return static_cast<int64_t>(k);
  return -1;
}

TEST(SwapPlan, AtomOrderPrefetchesAndKeepsTheLastSubModelAcrossTheTurn) {
  const SwapPlan plan = plan_of(equal_subs(3, 10, 1, 1), 32, 1);
  validate_swap_plan(plan);
  // The next load is issued right after the current compute; the last sub-model is never evicted
  // between its forward and its backward.
  EXPECT_EQ(position(plan, {Op::Load, 1}), position(plan, {Op::ComputeF, 0}) + 1);
  EXPECT_EQ(position(plan, {Op::ComputeB, 2}), position(plan, {Op::ComputeF, 2}) + 1);
  // Occupancy in issue order (parameters 10, activations 1, gradients 10 per sub-model): the most
  // is at the backward of sub-model 2 with sub-model 1 loading, 2 activations still held.
  const Occupancy o = occupancy(plan);
  EXPECT_DOUBLE_EQ(o.peak, 32);
  EXPECT_DOUBLE_EQ(o.after.back(), 0);
  // A budget one byte short is refused at that action, naming the budget's key.
  const SwapPlan tight = plan_of(equal_subs(3, 10, 1, 1), 31, 1);
  EXPECT_TRUE(test::throws_naming([&] { validate_swap_plan(tight); },
                                  {"action LOAD 1", "above its budget", "memory.device_budget_gb", ">>"}));
}

// Evaluation's plan: each sub-model loaded once, in forward order, the next one's load issued right
// after the current compute, each evicted after its forward; the ends loaded first and evicted
// last; nothing backward, stored or updated; at most the ends and two sub-models' parameters.
TEST(SwapPlan, ForwardOnlyPlanLoadsEachSubModelOnceAndKeepsTwoResident) {
  const SwapPlan plan = forward_only_swap_plan(plan_of(equal_subs(4, 10, 1, 1), 64, 1, 2, true));
  for (int64_t i = 0; i < 4; ++i) {
    EXPECT_EQ(count(plan, Op::Load, i), 1) << i;
    EXPECT_EQ(count(plan, Op::ComputeF, i), 1) << i;
    EXPECT_EQ(count(plan, Op::Evict, i), 1) << i;
    EXPECT_GT(position(plan, {Op::Evict, i}), position(plan, {Op::ComputeF, i})) << i;
    if (i + 1 < 4) {
      EXPECT_EQ(position(plan, {Op::Load, i + 1}), position(plan, {Op::ComputeF, i}) + 1) << i;
    }
  }
  EXPECT_EQ(plan.actions.front(), (Action{Op::Load, kEnds}));
  EXPECT_EQ(plan.actions.back(), (Action{Op::Evict, kEnds}));
  for (const Action& a : plan.actions)
    EXPECT_TRUE(a.op == Op::Load || a.op == Op::ComputeF || a.op == Op::Evict) << a.str();
  double resident = 0, most = 0;
  for (const Action& a : plan.actions) {
    if (a.op == Op::Load) resident += plan.sub(a.sub).parameter_bytes;
    if (a.op == Op::Evict) resident -= plan.sub(a.sub).parameter_bytes;
    most = std::max(most, resident);
  }
  EXPECT_DOUBLE_EQ(most, plan.ends.parameter_bytes + 20);
}

TEST(SwapPlan, BrokenPlansAreRefusedNamingTheAction) {
  const SwapPlan good = plan_of(equal_subs(3, 10, 1, 1), 100, 1);
  auto without = [&](Action a) {
    SwapPlan p = good;
    p.actions.erase(p.actions.begin() + position(p, a));
    return p;
  };
  EXPECT_TRUE(test::throws_naming([&] { validate_swap_plan(without({Op::Load, 1})); },
                                  {"COMPUTE_F 1", "not loaded"}));
  EXPECT_TRUE(test::throws_naming([&] { validate_swap_plan(without({Op::StoreGrad, 1})); },
                                  {"EVICT 1", "before its gradients are stored"}));
  EXPECT_TRUE(test::throws_naming([&] { validate_swap_plan(without({Op::Optim, 0})); },
                                  {"sub-model 0 is never updated"}));
  SwapPlan swapped = good;
  std::swap(swapped.actions[position(good, {Op::ComputeF, 1})], swapped.actions[position(good, {Op::ComputeF, 2})]);
  EXPECT_TRUE(test::throws_naming([&] { validate_swap_plan(swapped); }, {"forward out of order"}));
}

TEST(SwapPlan, ReplayHidesEveryLoadButTheFirstWhenTheBandwidthAllows) {
  // Loads of 10 bytes at 20 bytes/s take 0.5 s, under every compute (forward 1 s): only the first
  // load is exposed.
  const SwapTimeline fast = simulate_swap_plan(plan_of(equal_subs(4, 10, 1, 1), 1e9, 20));
  EXPECT_NEAR(fast.exposed_load, 0.5, 1e-12);
  EXPECT_NEAR(fast.load_time, 7 * 0.5, 1e-12);  // 4 forward loads, 3 backward (the last stays)
  EXPECT_NEAR(fast.compute_time, 4 * 3.0, 1e-12);
  // The step: the first load, all compute, then the last store (0.5 s) and optimizer step (1 s).
  EXPECT_NEAR(fast.step_time, 0.5 + 12 + 0.5 + 1, 1e-12);
  EXPECT_NEAR(fast.overlap(), 1 - 0.5 / 3.5, 1e-12);
  // At 2 bytes/s a load takes 5 s and the compute waits for each.
  const SwapTimeline slow = simulate_swap_plan(plan_of(equal_subs(4, 10, 1, 1), 1e9, 2));
  EXPECT_GT(slow.exposed_load, 5 * 5 - 4 - 1e-9);
  EXPECT_GT(slow.step_time, 7 * 5.0);
  EXPECT_LT(slow.overlap(), 0.5);
}

TEST(SwapPlan, MicroBatchesKeepSubModelZeroAcrossTheBottomTurnAndClippingDefersTheUpdates) {
  // Two micro-batches over three sub-models: sub-model 0 is loaded at the start and for each
  // backward, not for the second forward (it stays from the first backward into it); every sub-model's gradients are stored after each of its
  // backwards, the ends' after each micro-batch; each is updated once, after the last micro-batch.
  const SwapPlan p = plan_of(equal_subs(3, 10, 1, 1), 1e9, 1, 2);
  validate_swap_plan(p);
  EXPECT_EQ(count(p, Op::Load, 0), 3);
  EXPECT_EQ(count(p, Op::StoreGrad, 0), 2);
  EXPECT_EQ(count(p, Op::StoreGrad, 1), 2);
  EXPECT_EQ(count(p, Op::StoreGrad, kEnds), 2);
  EXPECT_EQ(count(p, Op::Optim, 1), 1);
  EXPECT_GT(position(p, {Op::Optim, 1}), position(p, {Op::StoreGrad, 1, 1}));
  EXPECT_LT(position(p, {Op::Optim, 1}), position(p, {Op::ComputeB, 0, 1}));  // overlaps the backward
  // A step's second forward before the first backward finished is refused.
  SwapPlan early = p;
  std::swap(early.actions[position(p, {Op::ComputeB, 0, 0})], early.actions[position(p, {Op::ComputeF, 0, 1})]);
  EXPECT_TRUE(test::throws_naming([&] { validate_swap_plan(early); }, {"COMPUTE_F 0 mb1", "micro-batch 0 is not finished"}));
  // Under clipping every update waits for every gradient; one moved ahead is refused.
  const SwapPlan deferred = plan_of(equal_subs(3, 10, 1, 1), 1e9, 1, 2, /*defer_optim=*/true);
  validate_swap_plan(deferred);
  EXPECT_GT(position(deferred, {Op::Optim, 2}), position(deferred, {Op::StoreGrad, 0, 1}));
  SwapPlan hasty = deferred;
  const Action optim{Op::Optim, 2};
  hasty.actions.erase(hasty.actions.begin() + position(hasty, optim));
  hasty.actions.insert(hasty.actions.begin() + position(hasty, {Op::StoreGrad, 2, 1}) + 1, optim);
  EXPECT_TRUE(test::throws_naming([&] { validate_swap_plan(hasty); }, {"OPTIM 2", "global norm", "optim.grad_clip"}));
  // The replay: deferred updates start after the last store.
  const SwapTimeline t = simulate_swap_plan(deferred);
  double last_store = 0, first_optim = 1e30;
  for (const TimedAction& a : t.actions) {
    if (a.action.op == Op::StoreGrad) last_store = std::max(last_store, a.end);
    if (a.action.op == Op::Optim) first_optim = std::min(first_optim, a.start);
  }
  EXPECT_GE(first_optim, last_store);
}

// The host's pass over every gradient (norm, clipping's scaling) holds the host stream: deferred
// updates start that long after the last store, and without deferral it ends the step.
TEST(SwapPlan, ThePassOverTheGradientsIsPriced) {
  auto first_optim_and_step = [](SwapPlan plan) {
    const SwapTimeline t = simulate_swap_plan(plan);
    double last_store = 0, first_optim = 1e30;
    for (const TimedAction& a : t.actions) {
      if (a.action.op == Op::StoreGrad) last_store = std::max(last_store, a.end);
      if (a.action.op == Op::Optim) first_optim = std::min(first_optim, a.start);
    }
    return std::vector<double>{last_store, first_optim, t.step_time};
  };
  SwapPlan deferred = plan_of(equal_subs(3, 10, 1, 1), 1e9, 1, 1, /*defer_optim=*/true);
  const std::vector<double> before = first_optim_and_step(deferred);
  deferred.gradients_stored_s = 5;
  const std::vector<double> after = first_optim_and_step(deferred);
  EXPECT_DOUBLE_EQ(after[1], std::max(before[1], before[0] + 5));
  EXPECT_DOUBLE_EQ(after[2], before[2] + (after[1] - before[1]));
  SwapPlan overlapped = plan_of(equal_subs(3, 10, 1, 1), 1e9, 1);
  const double step = simulate_swap_plan(overlapped).step_time;
  overlapped.gradients_stored_s = 5;
  EXPECT_DOUBLE_EQ(simulate_swap_plan(overlapped).step_time, step + 5);
}

}  // namespace
}  // namespace tessera::swap
