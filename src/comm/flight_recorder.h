// The flight recorder: the last operations of every communication group of this process, written
// to the run directory when a distributed run fails, and read back by `tessera doctor RUN_DIR`
// to say which rank stopped where (the question a hung or failed run leaves: who was everyone
// waiting for, and in which operation).
//
// Recording (comm::Group, group.h): every operation a group runs (each collective, each
// point-to-point post and wait, each composite operation's body) is recorded when it starts and
// when it ends, under the group's name, with a sequence number counted per group in this process
// and its text ("all_reduce of 4096 bytes", "recv of 512 bytes from rank 1"). The last
// kOperationsKept per group are kept; times are the wall clock (seconds since the epoch), so the
// records of ranks on one host line up, and those of other hosts up to their clocks' offset.
//
// Writing: write_flight_record(run_dir, rank, reason) writes RUN_DIR/flight/rank_<rank>.json,
//   {"rank": r, "written": t, "reason": "...",
//    "groups": [{"name": "pp", "ranks": [0, 1, 2], "operations": [{"seq", "op", "start", "end"}]}]}
// ("end" null while running). A rank killed outright writes nothing, and the doctor says so.
//
// Reading: diagnose_flight_records(records, world) is the doctor's text: per rank, the operation it
// was in (and for how long before it wrote) and its last finished one; then the verdict: the
// ranks that wrote no record, or whose last activity is the earliest, are where the others waited.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tessera::comm {

constexpr int64_t kOperationsKept = 64;

// A group of `ranks` (global, ascending) starts being recorded under `name` (a new group of the
// same name replaces the old record).
void flight_group(const std::string& name, const std::vector<int64_t>& ranks);
// An operation of group `name` started; returns its handle for flight_ended.
int64_t flight_started(const std::string& name, const std::string& op);
void flight_ended(const std::string& name, int64_t handle);
// The wall time (seconds since the epoch) at which the longest-running operation of any group that
// is still running started; 0 when none runs.
double oldest_running_flight_start();

// Every group's record, as written (without "rank", "written" and "reason").
nlohmann::json flight_snapshot();
// RUN_DIR/flight/rank_<rank>.json; never throws (a failing run must still report its own error).
void write_flight_record(const std::string& run_dir, int64_t rank, const std::string& reason);

// The doctor's report on the records found in RUN_DIR/flight, for a world of `world` ranks.
std::string diagnose_flight_records(const std::vector<nlohmann::json>& records, int64_t world);
// Reads RUN_DIR/flight/rank_*.json (throws naming the folder when there is none).
std::vector<nlohmann::json> read_flight_records(const std::string& run_dir);

}  // namespace tessera::comm
