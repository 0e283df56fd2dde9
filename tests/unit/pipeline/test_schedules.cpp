// Pipeline schedules as data: every built-in table validates, its replay with unit costs gives
// the schedule's bubble formula and stated activation peak, broken tables are refused naming the
// rank and action, and tables survive CSV.
#include <random>

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <tuple>

#include "parallel/pipeline/executor.h"
#include "parallel/pipeline/schedule_builders.h"
#include "parallel/pipeline/simulate.h"
#include "parallel/pipeline/validate.h"
#include "test_util.h"

namespace tessera::pipeline {
namespace {

// Index of `a` in rank r's actions (-1 when absent).
int64_t index_of(const Schedule& s, int64_t r, const Action& a) {
  const auto& v = s.ranks[r];
  const auto it = std::find(v.begin(), v.end(), a);
  return it == v.end() ? -1 : it - v.begin();
}

struct Case {
  std::string name;
  int64_t v;
  double (*formula)(double p, double m, double v);
  int64_t min_m_factor;  // the formula holds for m >= min_m_factor * p (0: any m)
};

const Case kCases[] = {
    {"gpipe", 1, [](double p, double m, double) { return (p - 1) / (m + p - 1); }, 0},
    {"1f1b", 1, [](double p, double m, double) { return (p - 1) / (m + p - 1); }, 0},
    {"interleaved", 2, [](double p, double m, double v) { return (p - 1) / (v * m + p - 1); }, 1},
    {"zbh1", 1, [](double p, double m, double) { return (p - 1) / (3 * m + p - 1); }, 1},
    {"zbv", 2, [](double p, double m, double) { return (p - 1) / (6 * m + p - 1); }, 1},
    // DualPipeV has no published formula for these costs; its replay gives ZB-V's (m >= 2p).
    {"dualpipev", 2, [](double p, double m, double) { return (p - 1) / (6 * m + p - 1); }, 2},
};

TEST(PipelineSchedules, BuiltInTablesValidateAndGiveTheirBubbleFormula) {
  for (const Case& c : kCases)
    for (int64_t p : {int64_t{2}, int64_t{4}, int64_t{8}})
      for (int64_t m : {int64_t{4}, int64_t{8}, int64_t{16}, 2 * p}) {
        if (m < c.min_m_factor * p || (c.name == "interleaved" && m % p != 0)) continue;
        const Schedule s = build_schedule(c.name, p, m, c.v);
        SCOPED_TRACE(c.name + " pp " + std::to_string(p) + " m " + std::to_string(m));
        ASSERT_NO_THROW(validate_schedule(s));
        const Simulation sim = simulate_schedule(s);
        ASSERT_TRUE(sim.stuck.empty());
        EXPECT_NEAR(sim.bubble(), c.formula(p, m, c.v), 1e-12) << format_grid(s);
      }
  // Interleaved with 3 and 4 chunks per rank.
  for (int64_t v : {3, 4}) {
    const Schedule s = build_schedule("interleaved", 4, 8, v);
    validate_schedule(s);
    EXPECT_NEAR(simulate_schedule(s).bubble(), 3.0 / (v * 8 + 3), 1e-12) << v;
  }
}

// Evaluation's table: every stage's forward of every micro-batch once, on the rank that holds the
// stage in the training table, nothing else computed; it runs to its end in the replay, and with
// one stage per rank it takes the pipeline's fill and drain, m + p - 1 forwards.
TEST(PipelineSchedules, ForwardOnlyTablesRunEveryForwardOnItsRankWithoutACycle) {
  for (const Case& c : kCases)
    for (int64_t p : {int64_t{2}, int64_t{4}}) {
      const int64_t m = 2 * p;
      const Schedule train = build_schedule(c.name, p, m, c.v);
      const Schedule eval = forward_only_schedule(train, 3);
      SCOPED_TRACE(c.name + " pp " + std::to_string(p));
      int64_t forwards = 0;
      for (int64_t r = 0; r < p; ++r)
        for (const Action& a : eval.ranks[static_cast<size_t>(r)]) {
          EXPECT_FALSE(a.is_parameter() || a.op == Op::B || a.op == Op::I || a.op == Op::W) << a.str();
          if (a.op != Op::F) continue;
          ++forwards;
          EXPECT_EQ(train.rank_of(a.stage), r) << a.str();
          EXPECT_GE(index_of(train, r, Action{Op::F, a.stage, 0}), 0) << a.str();
        }
      EXPECT_EQ(forwards, train.stages() * 3);
      const Simulation sim = simulate_schedule(eval);
      ASSERT_TRUE(sim.stuck.empty()) << format_grid(eval);
      if (c.v == 1) {
        EXPECT_DOUBLE_EQ(sim.step_time, 3 + p - 1) << format_grid(eval);
      }
    }
}

// The adaptive codecs' census: micro-batch 0's forward and whole backward of every stage, each on
// its training rank, in one sequential order that the replay runs to its end.
TEST(PipelineSchedules, TheCensusRunsOneMicroBatchThroughEveryStageAndBack) {
  for (const Case& c : kCases) {
    const Schedule train = build_schedule(c.name, 4, 8, c.v), census = census_schedule(train);
    std::vector<Action> computed;
    for (int64_t r = 0; r < 4; ++r)
      for (const Action& a : census.ranks[static_cast<size_t>(r)])
        if (a.is_compute()) {
          EXPECT_TRUE(a.micro == 0 && (a.op == Op::F || a.op == Op::B) && train.rank_of(a.stage) == r) << a.str();
          computed.push_back(a);
        }
    EXPECT_EQ(static_cast<int64_t>(computed.size()), 2 * train.stages()) << c.name;
    EXPECT_TRUE(simulate_schedule(census).stuck.empty()) << c.name << "\n" << format_grid(census);
  }
}

TEST(PipelineSchedules, PeakActivationsAreTheSchedulesCounts) {
  const int64_t p = 4, m = 8;
  const Simulation gpipe = simulate_schedule(build_schedule("gpipe", p, m, 1));
  const Simulation ofob = simulate_schedule(build_schedule("1f1b", p, m, 1));
  const Simulation zbh1 = simulate_schedule(build_schedule("zbh1", p, m, 1));
  const Simulation zbv = simulate_schedule(build_schedule("zbv", p, m, 2));
  const Simulation dualpipev = simulate_schedule(build_schedule("dualpipev", p, m, 2));
  for (int64_t r = 0; r < p; ++r) {
    EXPECT_EQ(dualpipev.peak_held[r], 2 * p + 1) << r;
    EXPECT_EQ(gpipe.peak_held[r], m) << r;
    EXPECT_EQ(ofob.peak_held[r], p - r) << r;
    EXPECT_EQ(zbh1.peak_held[r], p) << r;
    EXPECT_LE(zbv.peak_held[r], 2 * p) << r;  // chunks of half a stage: p whole stages
    // Before a rank's first B no gradient exists there (the memory estimate counts them after):
    // GPipe holds all m then, m - 1 at most after; 1F1B's warm-up already holds its p - r, and
    // its steady state as many again.
    auto most = [](const std::vector<int64_t>& by_awaiting) {
      return *std::max_element(by_awaiting.begin(), by_awaiting.end());
    };
    EXPECT_EQ(most(gpipe.peak_held_awaiting_w_before_gradients[r]), m) << r;
    EXPECT_EQ(most(gpipe.peak_held_awaiting_w_with_gradients[r]), m - 1) << r;
    EXPECT_EQ(most(ofob.peak_held_awaiting_w_before_gradients[r]), p - r) << r;
    EXPECT_EQ(most(ofob.peak_held_awaiting_w_with_gradients[r]), p - r) << r;
  }
  // 1F1B with fewer micro-batches than stages still runs (no hang), with the longer bubble.
  const Schedule short_run = build_schedule("1f1b", 8, 3, 1);
  validate_schedule(short_run);
  EXPECT_NEAR(simulate_schedule(short_run).bubble(), 7.0 / 10.0, 1e-12);
}

TEST(PipelineSchedules, ZeroBubbleBeatsOneFOneB) {
  ActionCosts half_stage;  // a V chunk is half a stage
  half_stage.f = half_stage.i = half_stage.w = 0.5;
  half_stage.b = 1;
  for (int64_t p : {4, 8}) {
    const double ofob = simulate_schedule(build_schedule("1f1b", p, 2 * p, 1), ActionCosts{}).step_time;
    const double zbh1 = simulate_schedule(build_schedule("zbh1", p, 2 * p, 1)).step_time;
    const double zbv = simulate_schedule(build_schedule("zbv", p, 2 * p, 2), half_stage).step_time;
    // Per micro-batch work 3 (F + I + W = F + B); 1F1B idles (p-1)*3, ZB-H1 (p-1)*1, ZB-V (p-1)*0.5.
    EXPECT_DOUBLE_EQ(ofob, 3 * 2 * p + 3 * (p - 1));
    EXPECT_DOUBLE_EQ(zbh1, 3 * 2 * p + (p - 1));
    EXPECT_DOUBLE_EQ(zbv, 3 * 2 * p + 0.5 * (p - 1));
  }
}

TEST(PipelineSchedules, MeasuredStagesAndRanksCostWhatTheyMeasured) {
  // 1F1B, pp 2, one micro-batch: F0, F1, B1, B0 in a chain, then each rank's optimizer step.
  Schedule s = build_schedule("1f1b", 2, 1, 1);
  add_parameter_actions(s, Gathers::none);
  ActionCosts costs;
  costs.stages = {{1, 2, 0, 0}, {3, 4, 0, 0}};
  costs.rank_optim = {0.5, 0.25};
  const Simulation sim = simulate_schedule(s, costs);
  EXPECT_NEAR(sim.step_time, 1 + 3 + 4 + 2 + 0.5, 1e-12);  // rank 0's B0 ends last, then its step
  EXPECT_NEAR(sim.busy[0], 1 + 2, 1e-12);
  EXPECT_NEAR(sim.busy[1], 3 + 4, 1e-12);
  // Without them, every stage costs f and b.
  EXPECT_NEAR(simulate_schedule(s).step_time, 1 + 1 + 2 + 2, 1e-12);
}

// The executor's host costs, as simulate.h states them: posting the first receive before a row's
// first action and the next one after each receive, posting a send on the sender; the data
// arrives `transfer` after a send was posted. A replay's per-action costs replace their stage's.
TEST(PipelineSchedules, PostingAndTransfersCostWhatTheyMeasured) {
  Schedule s = build_schedule("1f1b", 2, 1, 1);
  add_parameter_actions(s, Gathers::none);
  ActionCosts costs;
  costs.stages = {{1, 2, 0, 0}, {3, 4, 0, 0}};
  costs.rank_optim = {0.5, 0.25};
  costs.send = 0.1, costs.post = 0.2, costs.transfer = 0.05;
  // Rank 0: post 0.2, F0 to 1.2, SEND_F0 to 1.3 (arrives 1.35). Rank 1: RECV_F0 1.35 + post to 1.55,
  // F1 to 4.55, B1 to 8.55, SEND_B1 to 8.65 (arrives 8.7). Rank 0: RECV_B0 8.7 + post to 8.9, B0 to
  // 10.9, OPTIM to 11.4.
  const Simulation sim = simulate_schedule(s, costs);
  EXPECT_NEAR(sim.step_time, 11.4, 1e-12);
  EXPECT_NEAR(sim.busy[0], 1 + 2, 1e-12);  // posting and sending are not pipeline work
  costs.each[{Op::F, 1, 0}] = 10;
  EXPECT_NEAR(simulate_schedule(s, costs).step_time, 11.4 + 10 - 3, 1e-12);
}

// A receive proves which of this rank's sends arrived: those its sender took before sending it.
TEST(PipelineSchedules, AReceiveProvesTheSendsItsSenderTookBeforeIt) {
  const Schedule s = build_schedule("1f1b", 2, 4, 1);
  using Key = std::tuple<int64_t, int64_t, int64_t>;
  auto at_receive = [&](int64_t rank, const Action& recv) {
    const auto arrived = arrived_sends(s, rank);
    const auto it = arrived.find(static_cast<size_t>(index_of(s, rank, recv)));
    return it == arrived.end() ? std::vector<Key>{} : it->second;
  };
  // Rank 1 sends B0 after taking F0: rank 0's RECV_B0 proves its SEND_F0 (to stage 1) arrived.
  EXPECT_EQ(at_receive(0, {Op::RecvB, 0, 0}), (std::vector<Key>{{0, 1, 0}}));
  EXPECT_EQ(at_receive(0, {Op::RecvB, 0, 1}), (std::vector<Key>{{0, 1, 1}}));
  // Rank 0 sends F1 before taking anything; it sends F2 after taking B0.
  EXPECT_TRUE(at_receive(1, {Op::RecvF, 1, 1}).empty());
  EXPECT_EQ(at_receive(1, {Op::RecvF, 1, 2}), (std::vector<Key>{{1, 0, 0}}));
  // Over the rows, every send is proved at most once.
  for (int64_t r = 0; r < 2; ++r) {
    std::set<Key> seen;
    for (const auto& [index, keys] : arrived_sends(s, r))
      for (const Key& k : keys) EXPECT_TRUE(seen.insert(k).second);
  }
}

// ZB-V's list scheduler takes any positive per-stage costs (a measured run's) and gives a table the
// validator accepts; at the costs of a small GPT's measured stages (I 1.5x W) it idles less than
// the unit-cost table does at those costs.
TEST(PipelineSchedules, ZeroBubbleVIsBuiltForMeasuredCosts) {
  std::mt19937 random(7);
  std::uniform_real_distribution<double> cost(0.2, 5.0);
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t p = trial % 3 == 0 ? 4 : 2, m = 1 + static_cast<int64_t>(trial % 17);
    ActionCosts costs;
    for (int64_t s = 0; s < 2 * p; ++s) costs.stages.push_back({cost(random), cost(random), cost(random), cost(random)});
    Schedule s = build_schedule("zbv", p, m, 2, costs);
    EXPECT_NO_THROW(validate_schedule(s)) << "trial " << trial;
  }
  ActionCosts measured;
  measured.f = 6.3, measured.i = 7.9, measured.w = 5.2, measured.b = 13;
  const Schedule unit = build_schedule("zbv", 2, 8, 2), fitted = build_schedule("zbv", 2, 8, 2, measured);
  EXPECT_LT(simulate_schedule(fitted, measured).bubble(), simulate_schedule(unit, measured).bubble() / 2);
}

// Where a whole backward costs less than its two halves (tiny GPT on this CPU: a two-block chunk's
// B 14.78 ms against I + W 15.88, a four-block stage's 29.21 against 31.03), ZB-V's and ZB-H1's
// tables run some backwards whole: a shorter step than the tables that split every one, at the
// same costs. Where B = I + W (unit costs) they split them all.
TEST(PipelineSchedules, ZeroBubbleTablesRunBackwardsWholeWhereTheyCostLess) {
  auto whole = [](const Schedule& s) {
    int64_t n = 0;
    for (const auto& row : s.ranks)
      n += std::count_if(row.begin(), row.end(), [](const Action& a) { return a.op == Op::B; });
    return n;
  };
  auto costs = [](double f, double b, double i, double w) {
    ActionCosts c;
    c.f = f, c.b = b, c.i = i, c.w = w, c.transfer = 0.2;
    return c;
  };
  for (const auto& [name, v, cheaper, halves] :
       {std::make_tuple("zbv", 2, costs(6.5, 14.78, 9.71, 6.17), costs(6.5, 15.88, 9.71, 6.17)),
        std::make_tuple("zbh1", 1, costs(13, 29.21, 19.03, 12), costs(13, 31.03, 19.03, 12))})
    for (const int64_t p : {2, 4}) {
      const std::string what = std::string(name) + " pp " + std::to_string(p);
      const Schedule split = build_schedule(name, p, 16, v, halves), fused = build_schedule(name, p, 16, v, cheaper);
      EXPECT_EQ(whole(split), 0) << what;
      EXPECT_GT(whole(fused), 0) << what;
      EXPECT_NO_THROW(validate_schedule(fused)) << what;
      EXPECT_LT(simulate_schedule(fused, cheaper).step_time, simulate_schedule(split, cheaper).step_time) << what;
      const Simulation sim = simulate_schedule(fused, cheaper);
      for (int64_t r = 0; r < p; ++r) EXPECT_LE(sim.peak_held[r], fused.peak_limit[r]) << what << " rank " << r;
      EXPECT_EQ(whole(build_schedule(name, p, 16, v)), 0) << what;
    }
}

TEST(PipelineSchedules, BrokenTablesAreRefusedNamingRankAndAction) {
  const Schedule good = build_schedule("1f1b", 2, 4, 1);
  {  // A missing forward.
    Schedule s = good;
    s.ranks[1].erase(s.ranks[1].begin() + index_of(s, 1, {Op::F, 1, 2}));
    EXPECT_TRUE(test::throws_naming([&] { validate_schedule(s); }, {"the forward 1F2 is missing"}));
  }
  {  // A backward before its forward.
    Schedule s = good;
    std::swap(s.ranks[0][index_of(s, 0, {Op::F, 0, 3})], s.ranks[0][index_of(s, 0, {Op::B, 0, 3})]);
    EXPECT_TRUE(test::throws_naming([&] { validate_schedule(s); }, {"rank 0, action 0B3", "comes before its forward 0F3", "[0B3]"}));
  }
  {  // An unmatched send: the receive is gone.
    Schedule s = good;
    s.ranks[1].erase(s.ranks[1].begin() + index_of(s, 1, {Op::RecvF, 1, 1}));
    EXPECT_TRUE(test::throws_naming([&] { validate_schedule(s); }, {"rank 1", "no 1RECV_F1 precedes it"}));
  }
  {  // A send where no transfer is.
    Schedule s = good;
    s.ranks[1].push_back({Op::SendF, 1, 0});
    EXPECT_TRUE(test::throws_naming([&] { validate_schedule(s); }, {"1SEND_F0", "sends where no transfer is"}));
  }
  {  // A cycle: rank 0 waits for a gradient before sending the activation rank 1 needs to make it.
    Schedule s = build_schedule("gpipe", 2, 2, 1);
    auto& r0 = s.ranks[0];
    const int64_t recv = index_of(s, 0, {Op::RecvB, 0, 0});
    const Action moved = r0[recv];
    r0.erase(r0.begin() + recv);
    r0.insert(r0.begin() + index_of(s, 0, {Op::SendF, 0, 0}), moved);
    EXPECT_TRUE(test::throws_naming([&] { validate_schedule(s); },
                                    {"deadlocks", "rank 0 at 0RECV_B0 waits for the send 1SEND_B0 on rank 1",
                                     "rank 1 at 1RECV_F0 waits for the send 0SEND_F0 on rank 0"}));
  }
  {  // An action on a rank that does not hold its stage, and more activations than stated.
    Schedule s = good;
    s.ranks[0].push_back({Op::W, 1, 0});
    EXPECT_TRUE(test::throws_naming([&] { validate_schedule(s); }, {"stage 1 is held by rank 1"}));
    Schedule tight = good;
    tight.peak_limit[0] = 1;
    EXPECT_TRUE(test::throws_naming([&] { validate_schedule(tight); }, {"holds 2 micro-batches' activations", "1 the schedule states"}));
  }
}

// ZeRO-3's GATHER/RELEASE and the optimizer step as table actions: once per step a rank holds all
// its stages whole (interleaved: v of them), each stage's gather issued one compute action ahead;
// per action one stage at a time, with one gather per compute action ahead of its receive. A
// GATHER starts a fetch the compute action waits for. The validator refuses a compute action
// outside its gather and a misplaced OPTIM.
TEST(PipelineSchedules, GathersAndTheOptimizerStepAreActionsOfTheTable) {
  const int64_t p = 2, m = 4, v = 2;
  for (const Gathers mode : {Gathers::per_step, Gathers::per_action}) {
    Schedule s = build_schedule("interleaved", p, m, v);
    add_parameter_actions(s, mode);
    validate_schedule(s);
    const Simulation sim = simulate_schedule(s);
    for (int64_t r = 0; r < p; ++r) {
      int64_t gathers = 0, compute = 0;
      for (const Action& a : s.ranks[r]) {
        gathers += a.op == Op::Gather;
        compute += a.is_compute();
      }
      EXPECT_EQ(s.ranks[r].back().op, Op::Optim) << r;
      EXPECT_EQ(gathers, mode == Gathers::per_step ? v : compute) << r;
      EXPECT_EQ(sim.peak_gathered[r], mode == Gathers::per_step ? v : 1) << r;
    }
    // A rank's first gather runs ahead of the receive that feeds its action.
    const int64_t f = index_of(s, 1, {Op::F, 1, 0});
    EXPECT_EQ(s.ranks[1][f - 1].op, Op::RecvF);
    EXPECT_EQ(s.ranks[1][f - 2].op, Op::Gather);
    if (mode == Gathers::per_step) {  // the second stage's, ahead of the compute action before its first
      const auto& row = s.ranks[0];
      const int64_t gather = std::find(row.begin(), row.end(), Action{Op::Gather, 2, 0}) - row.begin();
      int64_t first = gather;
      while (!(row[first].is_compute() && row[first].stage == 2)) ++first;
      int64_t computes_between = 0;
      for (int64_t i = gather; i < first; ++i) computes_between += row[i].is_compute();
      EXPECT_EQ(computes_between, 1);
    }
  }
  // A fetch runs while the rank goes on: once per step, only the first gather is exposed (the
  // second stage's overlaps the compute action before its first). The bubble counts compute alone.
  Schedule once = build_schedule("interleaved", p, m, v);
  add_parameter_actions(once, Gathers::per_step);
  ActionCosts costs;
  costs.gather = 0.5;
  {
    const Simulation plain = simulate_schedule(once), with = simulate_schedule(once, costs);
    EXPECT_NEAR(with.step_time, plain.step_time + 0.5, 1e-9);
    EXPECT_NEAR(with.busy[0], plain.busy[0], 1e-12);
    int64_t exposed = 0;
    for (const TimedAction& t : with.timeline[0]) exposed += t.action.op == Op::Gather && t.end > t.start;
    EXPECT_EQ(exposed, 1);
  }
  // Per action a gather overlaps at most its receive's wait: the step grows by at least the first
  // and at most every gather.
  Schedule timed = build_schedule("1f1b", p, m, 1);
  add_parameter_actions(timed, Gathers::per_action);
  const double plain = simulate_schedule(timed).step_time, with = simulate_schedule(timed, costs).step_time;
  EXPECT_GT(with, plain + 0.5 - 1e-9);
  EXPECT_LE(with, plain + static_cast<double>(p * 2 * m) * 0.5 + 1e-9);

  Schedule good = build_schedule("1f1b", p, m, 1);
  add_parameter_actions(good, Gathers::per_action);
  {  // A compute action with no hold on its stage: the one gather of a per-step table gone.
    Schedule s = build_schedule("1f1b", p, m, 1);
    add_parameter_actions(s, Gathers::per_step);
    auto& row = s.ranks[0];
    row.erase(std::find(row.begin(), row.end(), Action{Op::Gather, 0, 0}));
    EXPECT_TRUE(test::throws_naming([&] { validate_schedule(s); },
                                    {"rank 0, action 0F0", "parameters of stage 0 are sharded", "[0F0]"}));
    Schedule each = good;  // per action: the gather right ahead of 0F2 (and its receive) gone
    const int64_t f = index_of(each, 0, {Op::F, 0, 2});
    ASSERT_EQ(each.ranks[0][f - 1].op, Op::Gather);
    each.ranks[0].erase(each.ranks[0].begin() + f - 1);
    EXPECT_TRUE(test::throws_naming([&] { validate_schedule(each); },
                                    {"rank 0, action 0F2", "parameters of stage 0 are sharded", "[0F2]"}));
  }
  {  // A release twice, and a stage never released.
    Schedule s = good;
    const int64_t f = index_of(s, 0, {Op::F, 0, 2});
    s.ranks[0].insert(s.ranks[0].begin() + f + 1, Action{Op::Release, 0, 0});
    EXPECT_TRUE(test::throws_naming([&] { validate_schedule(s); }, {"releases stage 0, which is not gathered"}));
    Schedule open = good;
    auto& row = open.ranks[1];
    row.erase(std::find(row.rbegin(), row.rend(), Action{Op::Release, 1, 0}).base() - 1);  // the last RELEASE
    EXPECT_TRUE(test::throws_naming([&] { validate_schedule(open); }, {"rank 1", "stage 1 is gathered and never released"}));
  }
  {  // OPTIM before a compute action, and on one rank only.
    Schedule s = good;
    s.ranks[0].pop_back();
    s.ranks[0].insert(s.ranks[0].begin(), Action{Op::Optim, 0, 0});
    EXPECT_TRUE(test::throws_naming([&] { validate_schedule(s); }, {"comes after the optimizer step"}));
    Schedule one = good;
    one.ranks[1].pop_back();
    EXPECT_TRUE(test::throws_naming([&] { validate_schedule(one); }, {"rank 1", "has no OPTIM"}));
  }
  // The text form reads back.
  EXPECT_EQ(parse_action("3GATHER", "t"), (Action{Op::Gather, 3, 0}));
  EXPECT_EQ(parse_action("1RELEASE", "t"), (Action{Op::Release, 1, 0}));
  EXPECT_EQ(parse_action("OPTIM", "t"), (Action{Op::Optim, 0, 0}));
  EXPECT_TRUE(test::throws_naming([&] { parse_action("1GATHER2", "cell"); }, {"cell", "1GATHER2", "<stage>GATHER"}));
}

// DualPipeV: every (stage, micro-batch) once, some backwards whole (B, paired with a forward of the
// other chunk in the steady state), the rest split into I and W.
TEST(PipelineSchedules, DualPipeVMixesWholeAndSplitBackwards) {
  const int64_t p = 4, m = 8;
  const Schedule s = build_schedule("dualpipev", p, m, 2);
  for (int64_t r = 0; r < p; ++r) {
    int64_t f = 0, b = 0, i = 0, w = 0;
    for (const Action& a : s.ranks[r]) {
      f += a.op == Op::F;
      b += a.op == Op::B;
      i += a.op == Op::I;
      w += a.op == Op::W;
    }
    EXPECT_EQ(f, 2 * m) << r;
    EXPECT_EQ(b + i, 2 * m) << r;
    EXPECT_EQ(i, w) << r;
    EXPECT_GT(b, 0) << r;
    EXPECT_GT(i, 0) << r;
  }
  // Steady state on rank 0: F of stage 0 paired with B of stage 7, F of 7 with B of 0.
  EXPECT_EQ(index_of(s, 0, {Op::B, 7, 3}), index_of(s, 0, {Op::F, 0, 7}) + 1 + 1) << format_grid(s, false);
  Schedule mixed = s;  // a W beside a whole B
  mixed.ranks[0].push_back({Op::W, 7, 3});
  EXPECT_TRUE(test::throws_naming([&] { validate_schedule(mixed); },
                                  {"a weight gradient without its input gradient 7I3"}));
  EXPECT_TRUE(test::throws_naming([] { build_schedule("dualpipev", 4, 7, 2); },
                                  {"dualpipev needs at least 2 x parallel.pp = 8 micro-batches"}));
}

TEST(PipelineSchedules, CombinationsThatCannotBeBuiltNameTheKey) {
  EXPECT_TRUE(test::throws_naming([] { build_schedule("interleaved", 4, 6, 2); },
                                  {"multiple of parallel.pp = 4", "train.global_batch_size"}));
  EXPECT_TRUE(test::throws_naming([] { build_schedule("interleaved", 4, 8, 1); }, {"parallel.pp_virtual >= 2"}));
  EXPECT_TRUE(test::throws_naming([] { build_schedule("zbv", 4, 8, 3); }, {"parallel.pp_virtual = 2"}));
  EXPECT_TRUE(test::throws_naming([] { build_schedule("1f1b", 4, 8, 2); }, {"parallel.pp_virtual must be 1"}));
  EXPECT_TRUE(test::throws_naming([] { build_schedule("zbh2", 4, 8, 1); }, {"'zbh2' is not a schedule", "zbv"}));
}

// memory.resident_micro_batches: a forward run while R others on the rank wait for their B or I
// is offloaded. 1F1B over 4 ranks and 8 micro-batches: rank 0 keeps micro-batches 0 and 4 (each
// run when none other was resident), rank 3 (F then B at once) none offloaded; R = 2 keeps 0, 1,
// 4, 5; every rank at R = its peak keeps all. Interleaved counts each stage's forward.
TEST(PipelineSchedules, HeldMicroBatchesBeyondTheResidentOnesAreOffloadedAsTheyCome) {
  auto micro_of = [](const std::vector<Action>& forwards) {
    std::vector<int64_t> out;
    for (const Action& a : forwards) {
      EXPECT_EQ(a.op, Op::F);
      out.push_back(a.micro);
    }
    return out;
  };
  const Schedule s = build_schedule("1f1b", 4, 8, 1);
  EXPECT_EQ(micro_of(held_offloaded_forwards(s.ranks[0], 1)), (std::vector<int64_t>{1, 2, 3, 5, 6, 7}));
  EXPECT_EQ(micro_of(held_offloaded_forwards(s.ranks[0], 2)), (std::vector<int64_t>{2, 3, 6, 7}));
  EXPECT_TRUE(held_offloaded_forwards(s.ranks[0], 4).empty());
  EXPECT_TRUE(held_offloaded_forwards(s.ranks[3], 1).empty());
  const Schedule interleaved = build_schedule("interleaved", 2, 8, 2);
  int64_t forwards = 0;
  for (const Action& a : interleaved.ranks[0]) forwards += a.op == Op::F ? 1 : 0;
  const std::vector<Action> off = held_offloaded_forwards(interleaved.ranks[0], 1);
  EXPECT_GT(off.size(), 0u);
  EXPECT_LT(static_cast<int64_t>(off.size()), forwards);
  for (const Action& a : off) EXPECT_EQ(interleaved.rank_of(a.stage), 0) << a.str();
}

TEST(PipelineSchedules, TablesRoundTripThroughCsv) {
  const std::string dir = test::fresh_dir("pipeline_csv");
  for (const std::string name : {"zbh1", "zbv"}) {
    const Schedule s = build_schedule(name, 4, 8, name == "zbv" ? 2 : 1);
    const std::string path = dir + "/" + name + ".csv";
    std::ofstream(path) << to_csv(s);
    const Schedule back = read_schedule_csv(path, 4, s.v, 8, s.placement);
    EXPECT_EQ(back.ranks, s.ranks) << name;
  }
  // A file with compute actions only gets its communication.
  std::ofstream(dir + "/compute.csv") << "0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n";
  const Schedule compute = read_schedule_csv(dir + "/compute.csv", 2, 1, 2, Placement::loop);
  validate_schedule(compute);
  EXPECT_EQ(index_of(compute, 1, {Op::RecvF, 1, 0}), 0);
  std::ofstream(dir + "/bad.csv") << "0F0,0X1\n1F0\n";
  EXPECT_TRUE(test::throws_naming([&] { read_schedule_csv(dir + "/bad.csv", 2, 1, 2, Placement::loop); },
                                  {"bad.csv: row 1, cell 2", "'0X1' is not an action"}));
}

}  // namespace
}  // namespace tessera::pipeline
