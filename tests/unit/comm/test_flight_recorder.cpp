// The flight recorder (comm/flight_recorder.h): operations recorded per group with their start and
// end, a failed one left open; the record written and read back; the doctor's verdict when a rank
// wrote nothing and when every rank wrote.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "comm/flight_recorder.h"
#include "test_util.h"

namespace tessera::comm {
namespace {

nlohmann::json record(int64_t rank, double written, nlohmann::json groups) {
  return {{"rank", rank}, {"written", written}, {"reason", "rank " + std::to_string(rank) + " failed\nmore"},
          {"groups", std::move(groups)}};
}

nlohmann::json op(int64_t seq, const std::string& text, double start, double end) {
  return {{"seq", seq}, {"op", text}, {"start", start}, {"end", end < 0 ? nlohmann::json(nullptr) : nlohmann::json(end)}};
}

TEST(FlightRecorder, RecordsOperationsAndKeepsTheLastOnes) {
  flight_group("test_dp", {0, 1});
  for (int i = 0; i < kOperationsKept + 5; ++i) flight_ended("test_dp", flight_started("test_dp", "all_reduce " + std::to_string(i)));
  const int64_t open = flight_started("test_dp", "all_gather of 8 bytes");
  nlohmann::json mine;
  for (const auto& g : flight_snapshot())
    if (g["name"] == "test_dp") mine = g;
  ASSERT_FALSE(mine.is_null());
  EXPECT_EQ(mine["ranks"], nlohmann::json({0, 1}));
  const auto& ops = mine["operations"];
  ASSERT_EQ(ops.size(), static_cast<size_t>(kOperationsKept));
  EXPECT_EQ(ops.back()["seq"], open);
  EXPECT_TRUE(ops.back()["end"].is_null());
  EXPECT_FALSE(ops[0]["end"].is_null());
  EXPECT_EQ(ops[0]["seq"], 6);  // the first six dropped

  const std::string dir = test::fresh_dir("flight");
  write_flight_record(dir, 3, "timed out");
  const auto records = read_flight_records(dir);
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0]["rank"], 3);
  EXPECT_EQ(records[0]["reason"], "timed out");
  std::filesystem::remove_all(dir);
}

TEST(FlightRecorder, TheDoctorNamesTheRankTheOthersWaitedFor) {
  // Rank 1 wrote nothing; ranks 0 and 2 were in pp operations with it.
  const nlohmann::json pp = {{"name", "pp"}, {"ranks", {0, 1, 2}}};
  nlohmann::json g0 = pp, g2 = pp;
  g0["operations"] = {op(40, "send of 512 bytes to rank 1", 100, 100.1), op(41, "recv of 512 bytes from rank 1", 100.2, -1)};
  g2["operations"] = {op(38, "recv of 512 bytes from rank 1", 99.0, 99.5), op(39, "recv of 512 bytes from rank 1", 99.6, -1)};
  const std::string said = diagnose_flight_records({record(0, 110.2, {g0}), record(2, 110.0, {g2})}, 3);
  for (const char* needle : {"flight records of 2 of 3 ranks; rank 1 wrote none", "rank 0: rank 0 failed",
                             "in pp (ranks 0, 1, 2): recv of 512 bytes from rank 1 (#41), running for 10.0 s",
                             "last finished: pp: send of 512 bytes to rank 1 (#40), 10.1 s before it wrote",
                             "where the run stopped: rank 1 (no record); ranks 0, 2 waited for it"})
    EXPECT_NE(said.find(needle), std::string::npos) << "missing '" << needle << "' in:\n" << said;
  EXPECT_EQ(said.find("more"), std::string::npos) << "only a reason's first line:\n" << said;

  // Every rank wrote: the one whose last operation is the earliest fell silent first.
  nlohmann::json d0 = {{"name", "dp"}, {"ranks", {0, 1}}}, d1 = d0;
  d0["operations"] = {op(7, "all_reduce of 64 bytes", 50, -1)};
  d1["operations"] = {op(6, "all_reduce of 64 bytes", 20, 21)};
  const std::string both = diagnose_flight_records({record(0, 60, {d0}), record(1, 60, {d1})}, 2);
  EXPECT_NE(both.find("rank 1: rank 1 failed\n  in no operation of any group"), std::string::npos) << both;
  EXPECT_NE(both.find("where the run stopped: rank 1, the first to fall silent (its last operation 39.0 s before "
                      "the last record was written, 29.0 s before the other ranks' last)"),
            std::string::npos)
      << both;
}

TEST(FlightRecorder, AFolderWithoutRecordsOrWithABadOneIsNamed) {
  const std::string dir = test::fresh_dir("flight_bad");
  EXPECT_TRUE(test::throws_naming([&] { read_flight_records(dir); }, {dir + "/flight", "no flight records"}));
  std::filesystem::create_directories(dir + "/flight");
  std::ofstream(dir + "/flight/rank_0.json") << "{\"rank\": 0}";
  EXPECT_TRUE(test::throws_naming([&] { read_flight_records(dir); }, {"rank_0.json", "not a flight record"}));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tessera::comm
