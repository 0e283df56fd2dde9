// The swarm's DHT on loopback: peers find each other from one initial peer, forged records are
// never seen, dead peers vanish after the record's lifetime, a round's members are seen at their
// new step before their records come, and a record of their old step published meanwhile does not
// take them back.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "unit/atom/test_key.h"
#include "atom/membership.h"

namespace tessera::atom {
namespace {


PeerRecord record_of(const std::string& id, int port) {
  PeerRecord r;
  r.id = id;
  r.address = "127.0.0.1:" + std::to_string(port);
  r.time = unix_now();
  return r;
}

// Polls `m` until it sees `n` live peers (or 20 s pass); returns what it saw last.
std::vector<PeerRecord> wait_for_peers(Membership& m, size_t n) {
  std::vector<PeerRecord> seen;
  for (int i = 0; i < 100; ++i) {
    seen = m.live_peers(0.5);
    if (seen.size() >= n) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return seen;
}

TEST(Membership, FourPeersStartedAtOnceFromOneInitialPeerFormOneSwarm) {
  Membership first("demo", kTestKey, "127.0.0.1", 0, {}, 30);
  const std::string initial = "127.0.0.1:" + std::to_string(first.port());
  first.publish(record_of("first", first.port()));
  std::vector<std::unique_ptr<Membership>> peers(4);
  std::vector<std::thread> starts;
  for (size_t i = 0; i < peers.size(); ++i)
    starts.emplace_back([&, i] { peers[i] = std::make_unique<Membership>("demo", kTestKey, "127.0.0.1", 0,
                                                                        std::vector<std::string>{initial}, 30); });
  for (auto& t : starts) t.join();
  for (size_t i = 0; i < peers.size(); ++i) peers[i]->publish(record_of("peer" + std::to_string(i), peers[i]->port()));
  for (auto& p : peers) {
    const std::vector<PeerRecord> seen = wait_for_peers(*p, 5);
    std::set<std::string> ids;
    for (const PeerRecord& r : seen) ids.insert(r.id);
    EXPECT_EQ(ids, (std::set<std::string>{"first", "peer0", "peer1", "peer2", "peer3"}));
  }
}

TEST(Membership, ForgedRecordsAreNeverSeenAndDeadPeersVanish) {
  Membership a("demo", kTestKey, "127.0.0.1", 0, {}, 3);
  Membership b("demo", kTestKey, "127.0.0.1", 0, {"127.0.0.1:" + std::to_string(a.port())}, 3);
  a.publish(record_of("honest", a.port()));
  // A node that knows the swarm's name but not its key, and one replaying an altered record.
  const SwarmKey wrong = SwarmKey::from_bytes(std::string(32, 'w'));
  b.publish_raw(record_of("forged", b.port()).encode("demo", wrong), 77);
  std::string altered = record_of("honest", a.port()).encode("demo", kTestKey);
  altered.replace(altered.find("honest"), 6, "hacked");
  b.publish_raw(altered, 78);
  std::vector<PeerRecord> seen = wait_for_peers(b, 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  seen = b.live_peers(1.0);
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].id, "honest");
  EXPECT_GT(b.refused_records() + a.refused_records(), 0);
  // "honest" stops publishing: after the 3 s lifetime no one sees it.
  std::this_thread::sleep_for(std::chrono::milliseconds(3500));
  EXPECT_TRUE(b.live_peers(1.0).empty());
}

TEST(Membership, ARoundsMembersAreSeenAtTheirNewStepUntilTheirOwnRecordsCome) {
  Membership a("demo", kTestKey, "127.0.0.1", 0, {}, 30);
  Membership b("demo", kTestKey, "127.0.0.1", 0, {"127.0.0.1:" + std::to_string(a.port())}, 30);
  PeerRecord mine = record_of("b", b.port());
  mine.samples = 16;
  mine.state = "00000000000000b0";  // its state's digest at step 0
  b.publish(mine);
  ASSERT_EQ(wait_for_peers(a, 1).size(), 1u);
  // a and b completed the round of swarm step 0: a sees b at step 1 with nothing accumulated at
  // once (its state's digest unknown until its own record comes); an id it never saw is not invented.
  a.saw_round({"b", "stranger"}, 1);
  std::vector<PeerRecord> seen = a.live_peers(0.5);
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].swarm_step, 1);
  EXPECT_EQ(seen[0].samples, 0);
  EXPECT_EQ(seen[0].state, "") << "its digest at step 1 is not its digest at step 0 (atom/swarm.h)";
  // b republishes its old step (its last sums came later than a's): newer by its time, older news.
  mine.time = unix_now();
  b.publish(mine);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  seen = a.live_peers(0.5);
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].swarm_step, 1) << "a record of an earlier step took the member back";
  // b's own newer record replaces the news.
  mine.swarm_step = 2;
  mine.time = unix_now() + 0.01;
  b.publish(mine);
  for (int i = 0; i < 50 && seen[0].swarm_step != 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    seen = a.live_peers(0.5);
  }
  EXPECT_EQ(seen[0].swarm_step, 2);
}

}  // namespace
}  // namespace tessera::atom
