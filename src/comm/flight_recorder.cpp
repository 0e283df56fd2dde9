// The flight recorder and the doctor's reading of it (flight_recorder.h).
#include "comm/flight_recorder.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/fs.h"

namespace tessera::comm {
namespace {

struct FlightOperation {
  int64_t seq = 0;
  std::string op;
  double start = 0, end = -1;  // end < 0: running
};

struct FlightGroup {
  std::vector<int64_t> ranks;
  int64_t next = 0;
  std::deque<FlightOperation> operations;
};

// Never destroyed: a communication thread left detached after a failure (group.cpp) and the
// heartbeat's thread may still read or write the recorder while the process's static objects are
// being destroyed at exit (std::mutex's destructor is trivial).
std::mutex flight_mutex;
std::map<std::string, FlightGroup>& flight_groups() {
  static auto* groups = new std::map<std::string, FlightGroup>;
  return *groups;
}

double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string seconds_text(double s) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f s", s);
  return text;
}

std::string rank_list(const std::vector<int64_t>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  return out;
}

}  // namespace

void flight_group(const std::string& name, const std::vector<int64_t>& ranks) {
  std::lock_guard<std::mutex> lock(flight_mutex);
  flight_groups()[name] = FlightGroup{ranks, 0, {}};
}

int64_t flight_started(const std::string& name, const std::string& op) {
  std::lock_guard<std::mutex> lock(flight_mutex);
  FlightGroup& g = flight_groups()[name];
  g.operations.push_back({g.next, op, wall_seconds(), -1});
  if (static_cast<int64_t>(g.operations.size()) > kOperationsKept) g.operations.pop_front();
  return g.next++;
}

void flight_ended(const std::string& name, int64_t handle) {
  std::lock_guard<std::mutex> lock(flight_mutex);
  FlightGroup& g = flight_groups()[name];
  for (auto it = g.operations.rbegin(); it != g.operations.rend(); ++it)
    if (it->seq == handle) {
      it->end = wall_seconds();
      return;
    }
}

double oldest_running_flight_start() {
  std::lock_guard<std::mutex> lock(flight_mutex);
  double oldest = 0;
  for (const auto& [name, g] : flight_groups())
    for (const FlightOperation& o : g.operations)
      if (o.end < 0 && (oldest == 0 || o.start < oldest)) oldest = o.start;
  return oldest;
}

nlohmann::json flight_snapshot() {
  std::lock_guard<std::mutex> lock(flight_mutex);
  nlohmann::json groups = nlohmann::json::array();
  for (const auto& [name, g] : flight_groups()) {
    nlohmann::json ops = nlohmann::json::array();
    for (const FlightOperation& o : g.operations)
      ops.push_back({{"seq", o.seq}, {"op", o.op}, {"start", o.start},
                     {"end", o.end < 0 ? nlohmann::json(nullptr) : nlohmann::json(o.end)}});
    groups.push_back({{"name", name}, {"ranks", g.ranks}, {"operations", ops}});
  }
  return groups;
}

void write_flight_record(const std::string& run_dir, int64_t rank, const std::string& reason) {
  try {
    const std::string dir = run_dir + "/flight";
    std::filesystem::create_directories(dir);
    const nlohmann::json record = {
        {"rank", rank}, {"written", wall_seconds()}, {"reason", reason}, {"groups", flight_snapshot()}};
    write_file_durable(dir + "/rank_" + std::to_string(rank) + ".json", record.dump(1) + "\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %lld: could not write its flight record into %s/flight: %s\n",
                 static_cast<long long>(rank), run_dir.c_str(), e.what());
  }
}

std::vector<nlohmann::json> read_flight_records(const std::string& run_dir) {
  const std::string dir = run_dir + "/flight";
  require(std::filesystem::is_directory(dir), dir, ": no flight records (a run writes them when it fails; this one "
          "did not, or is not a run directory)");
  std::vector<nlohmann::json> records;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("rank_", 0) != 0 || entry.path().extension() != ".json") continue;
    try {
      nlohmann::json r = nlohmann::json::parse(read_file(entry.path().string()));
      require(r.contains("rank") && r["rank"].is_number_integer() && r.contains("groups") && r["groups"].is_array() &&
                  r.contains("written") && r["written"].is_number(),
              "missing rank, written or groups");
      records.push_back(std::move(r));
    } catch (const nlohmann::json::exception& e) {
      fail(entry.path().string(), ": not a flight record (", e.what(), ")");
    } catch (const Error& e) {
      fail(entry.path().string(), ": not a flight record (", e.what(), ")");
    }
  }
  require(!records.empty(), dir, ": holds no rank_<N>.json");
  std::sort(records.begin(), records.end(), [](const auto& a, const auto& b) { return a["rank"] < b["rank"]; });
  return records;
}

std::string diagnose_flight_records(const std::vector<nlohmann::json>& records, int64_t world) {
  std::ostringstream out;
  double last_written = 0;
  std::set<int64_t> present;
  for (const auto& r : records) {
    last_written = std::max(last_written, r["written"].get<double>());
    present.insert(r["rank"].get<int64_t>());
  }
  std::vector<int64_t> silent;  // wrote no record
  for (int64_t r = 0; r < world; ++r)
    if (!present.count(r)) silent.push_back(r);
  out << "flight records of " << present.size() << " of " << world << " ranks";
  if (!silent.empty())
    out << "; rank" << (silent.size() > 1 ? "s " : " ") << rank_list(silent)
        << " wrote none (killed, stopped or lost before it could)";
  out << "\n";

  // Per rank: what it was in when it wrote, and its last finished operation; the time of its last
  // activity (a finished operation's end, a running one's start).
  std::map<int64_t, double> last_activity;
  std::vector<int64_t> waiting;  // ranks that were in an operation of a group with a silent rank
  for (const auto& r : records) {
    const int64_t rank = r["rank"];
    const double written = r["written"];
    out << "rank " << rank;
    const std::string reason = r.value("reason", "");
    if (!reason.empty()) out << ": " << reason.substr(0, reason.find('\n'));
    out << "\n";
    double activity = 0, last_end = -1;
    std::string last_op;
    bool running = false;
    for (const auto& g : r["groups"]) {
      const std::string group = g.value("name", "?");
      std::vector<int64_t> members;
      for (const auto& m : g["ranks"]) members.push_back(m.get<int64_t>());
      for (const auto& o : g["operations"]) {
        const double start = o["start"];
        activity = std::max(activity, start);
        if (o["end"].is_null()) {
          running = true;
          out << "  in " << group << " (ranks " << rank_list(members) << "): " << o.value("op", "?") << " (#"
              << o.value("seq", -1) << "), running for " << seconds_text(written - start) << "\n";
          const bool with_silent = std::any_of(silent.begin(), silent.end(), [&](int64_t s) {
            return std::find(members.begin(), members.end(), s) != members.end();
          });
          if (with_silent && (waiting.empty() || waiting.back() != rank)) waiting.push_back(rank);
        } else if (o["end"].get<double>() > last_end) {
          last_end = o["end"].get<double>();
          last_op = group + ": " + o.value("op", "?") + " (#" + std::to_string(o.value("seq", -1)) + ")";
        }
      }
    }
    activity = std::max(activity, last_end);
    last_activity[rank] = activity;
    if (!running) out << "  in no operation of any group\n";
    if (last_end >= 0) out << "  last finished: " << last_op << ", " << seconds_text(written - last_end) << " before it wrote\n";
  }

  out << "where the run stopped: ";
  if (!silent.empty()) {
    out << "rank" << (silent.size() > 1 ? "s " : " ") << rank_list(silent) << " (no record)";
    if (!waiting.empty())
      out << "; rank" << (waiting.size() > 1 ? "s " : " ") << rank_list(waiting) << " waited for "
          << (silent.size() > 1 ? "them" : "it") << " in the operations above";
    out << "\n";
    return out.str();
  }
  // Every rank wrote: the one whose last activity is the earliest fell silent first.
  auto first = std::min_element(last_activity.begin(), last_activity.end(),
                                [](const auto& a, const auto& b) { return a.second < b.second; });
  out << "rank " << first->first << ", the first to fall silent (its last operation "
      << seconds_text(last_written - first->second) << " before the last record was written";
  double next = -1;
  for (const auto& [rank, t] : last_activity)
    if (rank != first->first) next = std::max(next, t);
  if (next >= 0) out << ", " << seconds_text(next - first->second) << " before the other ranks' last";
  out << ")\n";
  return out.str();
}

}  // namespace tessera::comm
