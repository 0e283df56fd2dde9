// The swarm's message parsers (atom/messages.h) refuse what a buggy or hostile peer could send
// behind a valid key, naming the field, before any size or weight is used. Before the parsers were
// written once, a PART's element count of 2^62 + 1 with 4 bytes passed the byte check (the count
// times 4 wraps at 2^64) and reached at::empty, a negative weight went into the round's sum, and
// a negative chunk offset or a state offer of any size reached a read or an allocation.
#include <gtest/gtest.h>

#include <cstring>

#include <torch/types.h>
#include <torch/utils.h>

#include "atom/messages.h"
#include "atom/wire.h"
#include "test_util.h"

namespace tessera::atom {
namespace {

TEST(Messages, RoundMessagesRoundTrip) {
  const std::string body = pack({{"token", "t"}, {"piece", 3}, {"numel", 2}, {"weight", 16.0}, {"wait_s", 3.0}, {"rule", "median"}},
                                 encode_part(at::tensor({1.5f, -2.0f}), Codec::fp32));
  const PartMessage p = parse_part(body, "peer");
  EXPECT_EQ(p.token, "t");
  EXPECT_EQ(p.piece, 3);
  EXPECT_EQ(p.numel, 2);
  EXPECT_EQ(p.rule, Aggregation::median);
  const nlohmann::json screened = nlohmann::json::array({nlohmann::json::array({"a", 0.25, true})});
  const std::string sum = pack({{"piece", 1}, {"weight", 2.0}, {"screened", screened}}, "abcd");
  const SumReply reply = parse_sum(sum, "peer");
  EXPECT_EQ(reply.piece, 1);
  ASSERT_EQ(reply.screened.size(), 1u);
  EXPECT_EQ(reply.screened[0].member, "a");
  EXPECT_EQ(reply.screened[0].kept, 0.25);
  EXPECT_TRUE(reply.screened[0].outlier);
  EXPECT_TRUE(at::equal(decode_part(p.payload, p.numel, Codec::fp32, "peer"), at::tensor({1.5f, -2.0f})));
  const nlohmann::json members = nlohmann::json::array({nlohmann::json::array({"a", "h:1"}),
                                                        nlohmann::json::array({"b", "h:2"})});
  const GroupReply g = parse_group(pack({{"token", "t"}, {"members", members}, {"reason", ""}, {"overlap", 0}}), "x");
  ASSERT_EQ(g.members.size(), 2u);
  EXPECT_EQ(g.overlap_choice, 0);
  EXPECT_EQ(g.members[1].address, "h:2");
  EXPECT_EQ(parse_join(pack({{"round", 4}, {"address", "h:1"}, {"wait_s", 2.5}}), "x").round, 4);
  const JoinRequest j = parse_join(pack({{"round", 4}, {"address", "h:1"}, {"wait_s", 2.5}, {"state", "0a1b"}, {"state_step", 3}}), "x");
  EXPECT_EQ(j.state, "0a1b");
  EXPECT_EQ(j.state_step, 3);
  const std::string ring = pack({{"token", "t"}, {"row", 2}, {"step", 5}, {"numel", 2}, {"weight", 3.0}, {"wait_s", 1.0}},
                                encode_part(at::tensor({1.5f, -2.0f}), Codec::fp32));
  const RingMessage r = parse_ring(ring, "peer");  // its payload views `ring`
  EXPECT_EQ(r.row, 2);
  EXPECT_EQ(r.step, 5);
  EXPECT_EQ(r.weight, 3.0);
  EXPECT_TRUE(at::equal(decode_part(r.payload, r.numel, Codec::fp32, "peer"), at::tensor({1.5f, -2.0f})));
  EXPECT_EQ(parse_ring_open(pack({{"token", "t"}, {"wait_s", 2.0}}), "peer").token, "t");
  EXPECT_TRUE(test::throws_naming(
      [&] { parse_ring(pack({{"token", "t"}, {"row", -1}, {"step", 0}, {"numel", 0}, {"weight", 1.0}, {"wait_s", 1.0}}), "p"); },
      {"peer p", "'row'"}));
}

TEST(Messages, SparsePartsKeepEachChunksLargestEntries) {
  // Two chunks and a short third: a spike per chunk, the rest small; keeping 1 entry per chunk
  // (keep 1/4096) sends the spikes alone, at their places.
  const int64_t n = 2 * kSparseChunk + 7;
  at::Tensor v = at::rand({n}) * 0.1;
  v[5] = 3.0f;
  v[kSparseChunk + 4095] = -4.0f;
  v[2 * kSparseChunk + 6] = 2.0f;
  const PartEncoding one{Codec::fp32, true, 1.0 / kSparseChunk};
  const std::string bytes = encode_part(v, one);
  EXPECT_EQ(bytes.size(), 3u * (2 + 2 + 4)) << "per chunk: a count, an index and a float32 value";
  at::Tensor want = at::zeros({n});
  for (int64_t i : {int64_t{5}, kSparseChunk + 4095, 2 * kSparseChunk + 6}) want[i] = v[i];
  EXPECT_TRUE(at::equal(decode_part(bytes, n, one, "p"), want));
  // keep 1 (a round's sums): every nonzero entry, zeros left out; int8 values within their scale.
  const PartEncoding all{Codec::int8, true, 1.0};
  const at::Tensor back = decode_part(encode_part(want, all), n, all, "p");
  EXPECT_TRUE(test::all_close(back, want, 0, 4.0 / 127));
  EXPECT_EQ(back.ne(0).sum().item<int64_t>(), 3);
  EXPECT_EQ(encode_part(want, all).size(), 4u + 3 * 2 + 3 * 2 + 3) << "scale, counts, indices, int8 values";
}

TEST(Messages, HostileSparsePartsAreRefused) {
  const PartEncoding sparse{Codec::fp32, true, 0.5};
  auto part = [](std::vector<uint16_t> counts_then_indices, std::vector<float> values) {
    std::string out(reinterpret_cast<const char*>(counts_then_indices.data()), 2 * counts_then_indices.size());
    return out + std::string(reinterpret_cast<const char*>(values.data()), 4 * values.size());
  };
  EXPECT_NO_THROW(decode_part(part({2, 1, 3}, {1, 2}), 4, sparse, "p"));
  EXPECT_TRUE(test::throws_naming([&] { decode_part(part({5, 0, 1, 2, 3, 4}, {1, 2, 3, 4, 5}), 4, sparse, "p"); },
                                  {"keeps 5 of its 4 entries"}));
  EXPECT_TRUE(test::throws_naming([&] { decode_part(part({2, 3, 1}, {1, 2}), 4, sparse, "p"); }, {"out of place"}));
  EXPECT_TRUE(test::throws_naming([&] { decode_part(part({2, 1, 1}, {1, 2}), 4, sparse, "p"); }, {"out of place"}));
  EXPECT_TRUE(test::throws_naming([&] { decode_part(part({1, 4}, {1}), 4, sparse, "p"); }, {"out of place"}));
  EXPECT_TRUE(test::throws_naming([&] { decode_part(part({2, 1, 3}, {1}), 4, sparse, "p"); }, {"bytes"}));
  EXPECT_TRUE(test::throws_naming([&] { decode_part(part({2, 1}, {}), 4, sparse, "p"); }, {"indices"}));
  EXPECT_TRUE(test::throws_naming([&] { decode_part("", 4, sparse, "p"); }, {"chunk counts"}));
  EXPECT_TRUE(test::throws_naming([&] { decode_part(part({1, 0}, {NAN}), 4, sparse, "p"); }, {"non-finite"}));
}

// A ring's whole sum is decoded straight into its cell of the round's sum: the values land there,
// and a part of the wrong size or with a non-finite value is refused naming the peer.
TEST(Messages, ADenseFloatPartIsDecodedIntoItsPlace) {
  const std::vector<float> values = {1.5f, -2.0f, 3.25f};
  const std::string bytes(reinterpret_cast<const char*>(values.data()), 4 * values.size());
  const at::Tensor sum = torch::zeros({5});
  decode_fp32_part_into(bytes, sum.slice(0, 1, 4), "p");
  EXPECT_TRUE(torch::equal(sum, torch::tensor({0.0f, 1.5f, -2.0f, 3.25f, 0.0f})));
  EXPECT_TRUE(test::throws_naming([&] { decode_fp32_part_into(bytes, sum.slice(0, 0, 2), "peer-7"); },
                                  {"peer-7", "12 bytes where 8"}));
  const std::vector<float> bad = {1.0f, INFINITY, 2.0f};
  const std::string poisoned(reinterpret_cast<const char*>(bad.data()), 4 * bad.size());
  EXPECT_TRUE(test::throws_naming([&] { decode_fp32_part_into(poisoned, sum.slice(0, 1, 4), "peer-7"); },
                                  {"peer-7", "non-finite"}));
}

TEST(Messages, HostileFieldsAreRefusedByName) {
  // 2^62 + 1 float32 elements: 4 bytes once the byte count wraps at 2^64.
  const int64_t wraps = (int64_t{1} << 62) + 1;
  const std::string wrapping =
      pack({{"token", "t"}, {"piece", 0}, {"numel", wraps}, {"weight", 1.0}, {"wait_s", 1.0}, {"rule", "mean"}}, "abcd");
  EXPECT_TRUE(test::throws_naming([&] { parse_part(wrapping, "10.0.0.9:7000"); }, {"10.0.0.9:7000 sent 'numel'"}));
  EXPECT_TRUE(test::throws_naming([&] { decode_part("abcd", wraps, Codec::fp32, "p"); }, {"elements"}));
  // A negative weight; NaN and 1e400 are not JSON numbers and never parse.
  for (const char* bad : {"-1", "NaN", "1e400"}) {
    const std::string header = std::string(R"({"token":"t","piece":0,"numel":1,"wait_s":1,"rule":"mean","weight":)") + bad + "}";
    std::string body(4, '\0');
    const uint32_t n = static_cast<uint32_t>(header.size());
    std::memcpy(body.data(), &n, 4);
    const std::string message = body + header + "abcd";
    EXPECT_TRUE(test::throws_naming([&] { parse_part(message, "p"); },
                                    {bad == std::string("-1") ? "'weight'" : "malformed"}))
        << bad;
  }
  EXPECT_TRUE(test::throws_naming([&] { parse_join(pack({{"round", 1}, {"address", "h:1"}, {"wait_s", 1e9}}), "p"); },
                                  {"'wait_s'"}));
  EXPECT_TRUE(test::throws_naming(
      [&] { parse_join(pack({{"round", 1}, {"address", "h:1"}, {"wait_s", 1}, {"state", std::string(65, 'f')}}), "p"); },
      {"peer p", "state digest of 65 characters"}));
  // An integer field given as a float (converting 1e117 to int64_t is undefined behaviour).
  EXPECT_TRUE(test::throws_naming([&] { parse_join(pack({{"round", 1e117}, {"address", "h:1"}, {"wait_s", 1}}), "p"); },
                                  {"'round'"}));
  // An unknown rule; a screening that is not [member, kept in [0, 1], outlier].
  const std::string krum = pack({{"token", "t"}, {"piece", 0}, {"numel", 1}, {"weight", 1.0}, {"wait_s", 1.0}, {"rule", "krum"}});
  EXPECT_TRUE(test::throws_naming([&] { parse_part(krum, "p"); }, {"unknown aggregation rule"}));
  // A piece index past the most a part travels in, or missing.
  const std::string far = pack({{"token", "t"}, {"piece", kMaxPieces}, {"numel", 1}, {"weight", 1.0}, {"wait_s", 1.0},
                                {"rule", "mean"}});
  EXPECT_TRUE(test::throws_naming([&] { parse_part(far, "p"); }, {"p sent 'piece'"}));
  const std::string unnumbered = pack({{"weight", 1.0}});
  EXPECT_TRUE(test::throws_naming([&] { parse_sum(unnumbered, "p"); }, {"p sent", "piece"}));
  for (const nlohmann::json& bad : {nlohmann::json::array({nlohmann::json::array({"a", 1.5, false})}),
                                    nlohmann::json::array({nlohmann::json::array({"a", 0.5})}),
                                    nlohmann::json::array({nlohmann::json::array({std::string(65, 'a'), 0.5, true})}),
                                    nlohmann::json(3)}) {
    const std::string reply = pack({{"piece", 0}, {"weight", 1.0}, {"screened", bad}});
    EXPECT_TRUE(test::throws_naming([&] { parse_sum(reply, "p"); }, {"peer p sent a s"})) << bad.dump();
  }
  const nlohmann::json lone = nlohmann::json::array({nlohmann::json::array({"a"})});
  EXPECT_TRUE(test::throws_naming(
      [&] { parse_group(pack({{"token", "t"}, {"members", lone}, {"reason", ""}, {"overlap", -1}}), "p"); },
      {"[id, address]"}));
  const nlohmann::json pair = nlohmann::json::array({nlohmann::json::array({"a", "h:1"})});
  for (const nlohmann::json& overlap : {nlohmann::json(2), nlohmann::json(-2), nlohmann::json("1"), nlohmann::json()})
    EXPECT_TRUE(test::throws_naming(
        [&] { parse_group(pack({{"token", "t"}, {"members", pair}, {"reason", ""}, {"overlap", overlap}}), "p"); },
        {"p sent", "overlap"}))
        << overlap.dump();
  EXPECT_TRUE(test::throws_naming(
      [&] { parse_offer(R"({"ready":true,"swarm_step":3,"bytes":-5,"checksum":"x"})", "p"); }, {"'bytes'"}));
  for (const char* offset : {"-1", "18446744073709551615"})
    EXPECT_TRUE(test::throws_naming(
        [&] { parse_chunk_request(std::string(R"({"swarm_step":3,"length":5,"offset":)") + offset + "}", "p"); },
        {"'offset'"}));
  EXPECT_EQ(parse_round_request(R"({"swarm_step":7})", "p").swarm_step, 7);
  for (const char* step : {"-1", "1e30", "\"7\"", "18446744073709551615"})
    EXPECT_TRUE(test::throws_naming(
        [&] { parse_round_request(std::string(R"({"swarm_step":)") + step + "}", "p"); }, {"'swarm_step'"}))
        << step;
}

}  // namespace
}  // namespace tessera::atom
