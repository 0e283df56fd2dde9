// The residency layer (memory/residency/): the ZeRO-3 plan's table and printout, the plan check
// refusing plans that would run a part without its parameters or leave units behind, and the
// executor following a plan over real FlatUnits (a one-rank home, whose gather is a copy).
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include <torch/types.h>
#include <torch/utils.h>

#include "comm/group.h"
#include "memory/residency/flat_unit.h"
#include "memory/residency/residency.h"
#include "memory/residency/residency_plan.h"
#include "memory/residency/sharded_home.h"
#include "test_util.h"

namespace tessera {
namespace {

using Kind = ResidencyPoint::Kind;
using Action = ResidencyAction::Kind;

TEST(ResidencyPlan, Zero3PlanPrintsEveryActionInPassOrder) {
  EXPECT_EQ(zero3_plan(2).describe(),
            "training  before forward embedding: complete 2, fetch 0\n"
            "training  after forward embedding: release 2\n"
            "training  before forward block 0: complete 0, fetch 1\n"
            "training  after forward block 0: release 0\n"
            "training  before forward block 1: complete 1, fetch 2\n"
            "training  after forward block 1: release 1\n"
            "training  before forward head: complete 2\n"
            "training  before backward block 1: release 2, complete 1, fetch 0\n"
            "training  after reduction block 1: release 1\n"
            "training  before backward block 0: complete 0\n"
            "training  after reduction block 0: release 0\n"
            "inference  before forward embedding: complete 2, fetch 0\n"
            "inference  after forward embedding: release 2\n"
            "inference  before forward block 0: complete 0, fetch 1\n"
            "inference  after forward block 0: release 0\n"
            "inference  before forward block 1: complete 1, fetch 2\n"
            "inference  after forward block 1: release 1\n"
            "inference  before forward head: complete 2\n"
            "inference  after forward head: release 2\n");
}

// A plan that is the ZeRO-3 plan of two blocks except for the actions `skip` drops.
ResidencyPlan zero3_without(Pass pass, ResidencyPoint point, ResidencyAction skip) {
  const ResidencyPlan full = zero3_plan(2);
  ResidencyPlan plan(2);
  const std::vector<ResidencyPoint> points = {
      {Kind::before_forward, ModelPart::embedding()}, {Kind::after_forward, ModelPart::embedding()},
      {Kind::before_forward, ModelPart::block(0)},    {Kind::after_forward, ModelPart::block(0)},
      {Kind::before_forward, ModelPart::block(1)},    {Kind::after_forward, ModelPart::block(1)},
      {Kind::before_forward, ModelPart::head()},      {Kind::after_forward, ModelPart::head()},
      {Kind::before_backward, ModelPart::block(1)},   {Kind::after_reduction, ModelPart::block(1)},
      {Kind::before_backward, ModelPart::block(0)},   {Kind::after_reduction, ModelPart::block(0)}};
  for (Pass p : {Pass::training, Pass::inference})
    for (const auto& pt : points)
      for (const auto& a : full.at(p, pt)) {
        const bool dropped = p == pass && !(pt < point) && !(point < pt) && a.kind == skip.kind && a.unit == skip.unit;
        if (!dropped) plan.add(p, pt, a);
      }
  return plan;
}

std::string refusal(const ResidencyPlan& plan) {
  try {
    plan.validate();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(ResidencyPlan, RefusesAPartRunWithoutItsUnit) {
  // The head's forward without bringing the ends back (released after the embedding).
  EXPECT_NE(refusal(zero3_without(Pass::training, {Kind::before_forward, ModelPart::head()}, {Action::complete, 2}))
                .find("unit 2 is not resident for its forward at before forward head"),
            std::string::npos);
  // Block 1's backward without gathering it again.
  EXPECT_NE(refusal(zero3_without(Pass::training, {Kind::before_backward, ModelPart::block(1)}, {Action::complete, 1}))
                .find("unit 1 is not resident for its backward at before backward block 1"),
            std::string::npos);
}

TEST(ResidencyPlan, RefusesReleasingTheEndsBeforeTheHeadsBackward) {
  ResidencyPlan plan = zero3_plan(2);
  plan.add(Pass::training, {Kind::after_forward, ModelPart::head()}, {Action::release, 2});
  EXPECT_NE(refusal(plan).find("unit 2 is not resident for the head's backward"), std::string::npos);
}

TEST(ResidencyPlan, RefusesUnitsLeftBehindAtTheEndOfAPass) {
  EXPECT_NE(refusal(zero3_without(Pass::inference, {Kind::after_forward, ModelPart::head()}, {Action::release, 2}))
                .find("(inference): unit 2 is still resident when the pass ends"),
            std::string::npos);
  ResidencyPlan fetched = zero3_plan(2);
  fetched.add(Pass::training, {Kind::after_reduction, ModelPart::block(0)}, {Action::fetch, 0});
  EXPECT_NE(refusal(fetched).find("(training): unit 0 is still being fetched when the pass ends"), std::string::npos);
}

// The executor over four one-parameter FlatUnits with a one-rank home, block 1's unit made of two
// of them (as a block's dense parameters and its experts are): storage appears and goes exactly
// as the plan says, for every FlatUnit of a unit, and a fetched unit holds its shard's values.
TEST(Residency, FollowsThePlanOverFlatUnits) {
  comm::Group home("dp", {0}, 0, nullptr, std::chrono::milliseconds(1000));
  std::vector<at::Tensor> params;
  std::vector<FlatUnit> units;
  for (int u = 0; u < 4; ++u) {
    params.push_back(torch::full({4, 3}, static_cast<float>(u + 1)));
    units.emplace_back(std::vector<std::pair<std::string, at::Tensor>>{{"p" + std::to_string(u), params.back()}},
                       home, /*own_shard=*/true);
  }
  ShardedHome sharded(units, {{0}, {1, 3}, {2}});
  Residency residency(sharded, zero3_plan(2));
  residency.release_all();
  auto resident = [&] {
    std::string s;
    for (size_t u = 0; u < 3; ++u) s += residency.resident(u) ? '1' : '0';
    return s;
  };
  EXPECT_EQ(resident(), "000");
  EXPECT_EQ(params[2].storage().nbytes(), 0u);
  residency.at(Pass::training, {Kind::before_forward, ModelPart::embedding()});
  EXPECT_EQ(resident(), "101");  // the ends, and block 0 fetched ahead (a one-rank gather is done at once)
  EXPECT_TRUE(params[2].equal(torch::full({4, 3}, 3.0f)));
  residency.at(Pass::training, {Kind::after_forward, ModelPart::embedding()});
  EXPECT_EQ(resident(), "100");
  residency.at(Pass::training, {Kind::before_forward, ModelPart::block(0)});
  residency.at(Pass::training, {Kind::after_forward, ModelPart::block(0)});
  EXPECT_EQ(resident(), "010");
  EXPECT_TRUE(params[3].equal(torch::full({4, 3}, 4.0f)));  // block 1 fetched ahead, both of its FlatUnits
  residency.at(Pass::training, {Kind::before_forward, ModelPart::block(1)});
  residency.at(Pass::training, {Kind::after_forward, ModelPart::block(1)});
  residency.at(Pass::training, {Kind::before_forward, ModelPart::head()});
  EXPECT_EQ(resident(), "001");
  EXPECT_EQ(params[3].storage().nbytes(), 0u);
  residency.at(Pass::training, {Kind::before_backward, ModelPart::block(1)});
  EXPECT_EQ(resident(), "110");
  EXPECT_TRUE(params[0].equal(torch::full({4, 3}, 1.0f)));
  residency.at(Pass::training, {Kind::after_reduction, ModelPart::block(1)});
  residency.at(Pass::training, {Kind::before_backward, ModelPart::block(0)});
  residency.at(Pass::training, {Kind::after_reduction, ModelPart::block(0)});
  EXPECT_EQ(resident(), "000");
}

// A unit built from meta parameters and their initial values holds what one built from the same
// values materialised does: the parameters become views of its flat buffer with those values, and
// its shard equals the other's; a meta unit without values is refused.
TEST(FlatUnit, BuildsFromMetaParametersAndTheirInitialValues) {
  comm::Group home("dp", {0}, 0, nullptr, std::chrono::milliseconds(1000));
  const std::map<std::string, at::Tensor> values = {{"w", torch::arange(6, torch::kFloat).view({2, 3})},
                                                    {"b", torch::full({4}, 0.5f)}};
  at::Tensor w = torch::empty({2, 3}, torch::device(at::kMeta)).requires_grad_(true);
  at::Tensor b = torch::empty({4}, torch::device(at::kMeta)).requires_grad_(true);
  InitialValues initial{at::TensorOptions().dtype(at::kFloat), [&](const std::string& name) { return values.at(name); }};
  FlatUnit unit({{"w", w}, {"b", b}}, home, /*own_shard=*/true, &initial);
  EXPECT_FALSE(w.is_meta());
  EXPECT_TRUE(w.requires_grad());
  EXPECT_TRUE(w.equal(values.at("w")));
  EXPECT_TRUE(b.equal(values.at("b")));
  EXPECT_TRUE(w.storage().is_alias_of(unit.flat().storage()));
  at::Tensor w2 = values.at("w").clone(), b2 = values.at("b").clone();
  FlatUnit whole({{"w", w2}, {"b", b2}}, home, /*own_shard=*/true);
  EXPECT_TRUE(unit.shard().equal(whole.shard()));
  unit.release();
  EXPECT_EQ(w.storage().nbytes(), 0u);
  at::Tensor m = torch::empty({3}, torch::device(at::kMeta));
  EXPECT_TRUE(test::throws_naming([&] { FlatUnit bad({{"m", m}}, home, true); }, {"meta parameters without"}));
}

// Driven by a schedule instead of a plan (a pipeline stage's units): holds are counted, the first
// fetches, complete makes the unit resident, the last drop releases; a part the stage does not
// hold has no FlatUnits and is never anything but "resident"; a held unit is not released by
// release_all, and a plan's actions are refused.
TEST(Residency, HoldsAreCountedWhenAScheduleDrivesIt) {
  comm::Group home("dp", {0}, 0, nullptr, std::chrono::milliseconds(1000));
  at::Tensor a = torch::full({2, 5}, 7.0f), b = torch::full({3}, -1.0f);
  std::vector<FlatUnit> units;
  units.emplace_back(std::vector<std::pair<std::string, at::Tensor>>{{"a", a}}, home, /*own_shard=*/true);
  units.emplace_back(std::vector<std::pair<std::string, at::Tensor>>{{"b", b}}, home, /*own_shard=*/true);
  ShardedHome sharded(units, {{}, {0, 1}});
  Residency residency(sharded);
  EXPECT_FALSE(residency.planned());
  residency.release_all();
  EXPECT_EQ(a.storage().nbytes(), 0u);
  EXPECT_TRUE(residency.resident(0));
  EXPECT_FALSE(residency.resident(1));
  residency.hold(1);
  residency.hold(1);
  residency.complete(1);
  EXPECT_TRUE(residency.resident(1));
  EXPECT_TRUE(a.equal(torch::full({2, 5}, 7.0f)));
  EXPECT_TRUE(b.equal(torch::full({3}, -1.0f)));
  EXPECT_TRUE(test::throws_naming([&] { residency.release_all(); }, {"unit 1", "held"}));
  residency.drop(1);
  EXPECT_TRUE(residency.resident(1));
  residency.drop(1);
  EXPECT_FALSE(residency.resident(1));
  EXPECT_EQ(b.storage().nbytes(), 0u);
  EXPECT_TRUE(test::throws_naming([&] { residency.drop(1); }, {"unit 1", "not held"}));
  EXPECT_TRUE(test::throws_naming([&] { residency.at(Pass::training, {Kind::before_forward, ModelPart::head()}); },
                                  {"no plan"}));
}

}  // namespace
}  // namespace tessera
