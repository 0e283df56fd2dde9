// The rounds' log a peer serves to peers that replay it (atom/round_log.h): it keeps the newest
// consecutive rounds within its budget, serves a held round bit for bit and an empty reply for
// one it does not hold, and a reply of the wrong size or with a value not finite is refused.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>

#include <torch/types.h>
#include <torch/utils.h>

#include "unit/atom/test_key.h"
#include "atom/round_log.h"
#include "atom/wire.h"

namespace tessera::atom {
namespace {


// A log served on its own listener, as a peer serves it; `reply`, when set, answers instead.
struct ServedLog {
  RoundLog log;
  std::function<void(Channel&)> reply;
  std::unique_ptr<Listener> listener;
  explicit ServedLog(int64_t max_bytes) : log(max_bytes) {
    listener = std::make_unique<Listener>(
        "127.0.0.1", 0, kTestKey, "donor", 1 << 26,
        [this](std::unique_ptr<Channel> c) {
          const Message first = c->receive(Deadline::in(5));
          if (reply) return reply(*c);
          log.serve(*c, first);
        },
        nullptr);
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(listener->port()); }
  at::Tensor fetch(int64_t step, int64_t numel) {
    return fetch_round(address(), kTestKey, "asker", step, numel, 1 << 26, Deadline::in(10));
  }
};

TEST(RoundLog, KeepsTheNewestConsecutiveRoundsWithinItsBudgetAndServesThemExactly) {
  // 100 float32 values are 400 bytes: a budget of 1,000 bytes holds two rounds.
  ServedLog served(1000);
  std::vector<at::Tensor> means;
  for (int64_t s = 0; s < 4; ++s) {
    means.push_back(at::randn({100}));
    served.log.add(10 + s, means.back());
  }
  EXPECT_EQ(served.log.rounds(), 2);
  EXPECT_FALSE(served.fetch(11, 100).defined());  // dropped for the budget
  for (int64_t s : {12, 13}) EXPECT_TRUE(at::equal(served.fetch(s, 100), means[static_cast<size_t>(s - 10)]));
  EXPECT_FALSE(served.fetch(14, 100).defined());  // not yet taken
  // A gap (the peer took the others' state) starts the log afresh: replays must be contiguous.
  served.log.add(20, at::randn({100}));
  EXPECT_EQ(served.log.rounds(), 1);
  EXPECT_FALSE(served.fetch(13, 100).defined());
  // A round larger than the budget is not kept, and a budget of 0 keeps none.
  served.log.add(21, at::randn({1000}));
  EXPECT_EQ(served.log.rounds(), 0);
  RoundLog none(0);
  none.add(0, at::randn({1}));
  EXPECT_EQ(none.rounds(), 0);
}

TEST(RoundLog, AReplyOfTheWrongSizeOrNotFiniteIsRefusedNamingThePeer) {
  ServedLog served(1 << 20);
  served.log.add(3, at::randn({8}));
  try {
    served.fetch(3, 9);  // the asker's model has 9 values: the donor's 8 are another model's
    FAIL() << "a round of another size was taken";
  } catch (const WireError& e) {
    EXPECT_NE(std::string(e.what()).find("where 9 float32 values are 36"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(served.address()), std::string::npos) << e.what();
  }
  served.reply = [](Channel& c) {
    const float values[2] = {1.0f, std::numeric_limits<float>::quiet_NaN()};
    c.send(kRoundReply, std::string_view(reinterpret_cast<const char*>(values), sizeof(values)), Deadline::in(5));
  };
  try {
    served.fetch(3, 2);
    FAIL() << "a round with a NaN was taken";
  } catch (const WireError& e) {
    EXPECT_NE(std::string(e.what()).find("not finite"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tessera::atom
