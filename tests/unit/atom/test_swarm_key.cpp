// The swarm key: files refused by name, tags, records that verify only under their key.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "atom/peer_record.h"
#include "atom/swarm_key.h"
#include "core/error.h"
#include "test_util.h"

namespace tessera::atom {
namespace {

TEST(SwarmKey, GeneratedKeysLoadAndBadFilesAreNamed) {
  const std::string dir = test::fresh_dir("swarm_key");
  const std::string path = dir + "/swarm.key";
  SwarmKey::generate(path);
  EXPECT_EQ(std::filesystem::status(path).permissions() & std::filesystem::perms::others_read,
            std::filesystem::perms::none);
  const SwarmKey a = SwarmKey::load(path), b = SwarmKey::load(path);
  EXPECT_EQ(a.tag("m"), b.tag("m"));
  EXPECT_NE(a.tag("m"), a.tag("n"));
  EXPECT_EQ(a.tag({"ab", "c"}), a.tag("abc"));
  EXPECT_TRUE(test::throws_naming([&] { SwarmKey::generate(path); }, {path, "never overwritten"}));
  EXPECT_TRUE(test::throws_naming([&] { SwarmKey::load(""); }, {"swarm.key_file is not set", "keygen"}));
  EXPECT_TRUE(test::throws_naming([&] { SwarmKey::load(dir + "/none"); }, {dir + "/none", "does not exist"}));
  std::ofstream(dir + "/short") << "abcd\n";
  EXPECT_TRUE(test::throws_naming([&] { SwarmKey::load(dir + "/short"); }, {dir + "/short", "at least 32"}));
  std::ofstream(dir + "/text") << "not a key at all, just words\n";
  EXPECT_TRUE(test::throws_naming([&] { SwarmKey::load(dir + "/text"); }, {dir + "/text", "hexadecimal"}));
  EXPECT_TRUE(test::throws_naming([&] { SwarmKey::load(dir); }, {dir}));
}

TEST(PeerRecord, VerifiesUnderItsKeyAndSwarmOnly) {
  const SwarmKey key = SwarmKey::from_bytes(std::string(32, 'k')), other = SwarmKey::from_bytes(std::string(32, 'o'));
  PeerRecord r;
  r.id = "00ff";
  r.address = "127.0.0.1:4000";
  r.swarm_step = 3;
  r.samples = 12;
  r.time = unix_now();
  r.state = "0123456789abcdef";
  const std::string bytes = r.encode("demo", key);
  const auto back = PeerRecord::parse(bytes, "demo", key);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->id, "00ff");
  EXPECT_EQ(back->swarm_step, 3);
  EXPECT_EQ(back->samples, 12);
  EXPECT_EQ(back->state, "0123456789abcdef");
  EXPECT_FALSE(PeerRecord::parse(bytes, "demo", other));   // another key
  EXPECT_FALSE(PeerRecord::parse(bytes, "other", key));    // another swarm
  std::string altered = bytes;
  altered[altered.find("12")] = '9';                        // samples 92: the tag no longer matches
  EXPECT_FALSE(PeerRecord::parse(altered, "demo", key));
  EXPECT_FALSE(PeerRecord::parse("", "demo", key));
  EXPECT_FALSE(PeerRecord::parse(std::string(kMaxRecordBytes + 1, 'x'), "demo", key));
  // Well-tagged but malformed JSON (a peer with the key and a bug) is refused too.
  PeerRecord bad = r;
  bad.samples = -1;
  EXPECT_FALSE(PeerRecord::parse(bad.encode("demo", key), "demo", key));
  bad = r;
  bad.state = std::string(65, 'a');  // a state digest is 16 hex digits; past 64 characters refused
  EXPECT_FALSE(PeerRecord::parse(bad.encode("demo", key), "demo", key));
  // An integer written as a float past int64_t (found by fuzz_swarm_messages: converting it was
  // undefined behaviour), or as an unsigned past int64_t, is refused.
  const std::string fields = R"({"id":"00ff","address":"h:1","local_step":1,"claimed":0,"loss":1.0,)"
                             R"("samples_per_s":1.0,"time":1.0,"serving_state":false,"swarm_step":3,"samples":)";
  EXPECT_TRUE(PeerRecord::parse(PeerRecord::signed_text(fields + "12}", "demo", key), "demo", key));  // no state: unknown
  EXPECT_FALSE(PeerRecord::parse(PeerRecord::signed_text(fields + R"(12,"state":7})", "demo", key), "demo", key));
  for (const char* samples : {"1.1e117", "12.0", "18446744073709551615"})
    EXPECT_FALSE(PeerRecord::parse(PeerRecord::signed_text(fields + samples + "}", "demo", key), "demo", key))
        << samples;
}

}  // namespace
}  // namespace tessera::atom
