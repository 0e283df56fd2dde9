// Schedule tables: actions, placement, communication insertion, CSV and grid text (schedule.h).
#include "parallel/pipeline/schedule.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/fs.h"

namespace tessera::pipeline {
namespace {

struct OpName {
  Op op;
  const char* name;
};
// Longest names first, so that "SEND_F" is not read as "S..." of something shorter.
constexpr OpName kOpNames[] = {{Op::Release, "RELEASE"}, {Op::Gather, "GATHER"}, {Op::SendF, "SEND_F"},
                               {Op::RecvF, "RECV_F"},    {Op::SendB, "SEND_B"},   {Op::RecvB, "RECV_B"},
                               {Op::F, "F"},             {Op::B, "B"},            {Op::I, "I"},
                               {Op::W, "W"},             {Op::Optim, "OPTIM"}};

std::string trimmed(const std::string& s) {
  const auto begin = s.find_first_not_of(" \t\r\n");
  if (begin == std::string::npos) return "";
  return s.substr(begin, s.find_last_not_of(" \t\r\n") - begin + 1);
}

}  // namespace

const char* op_name(Op op) {
  for (const auto& n : kOpNames)
    if (n.op == op) return n.name;
  return "?";
}

std::string Action::str() const {
  if (op == Op::Optim) return op_name(op);
  if (op == Op::Gather || op == Op::Release) return std::to_string(stage) + op_name(op);
  return std::to_string(stage) + op_name(op) + std::to_string(micro);
}

Action parse_action(const std::string& text, const std::string& where) {
  const std::string t = trimmed(text);
  if (t == op_name(Op::Optim)) return {Op::Optim, 0, 0};
  size_t i = 0;
  while (i < t.size() && std::isdigit(static_cast<unsigned char>(t[i]))) ++i;
  auto bad = [&]() {
    fail(where, ": '", t, "' is not an action (<stage><F|B|I|W|SEND_F|RECV_F|SEND_B|RECV_B><micro-batch>, e.g. 0F3; "
         "<stage>GATHER, <stage>RELEASE; OPTIM)");
  };
  if (i == 0 || i > 9) bad();
  for (const auto& n : kOpNames) {
    const size_t len = std::char_traits<char>::length(n.name);
    if (n.op == Op::Optim || t.compare(i, len, n.name) != 0) continue;
    const std::string micro = t.substr(i + len);
    if (n.op == Op::Gather || n.op == Op::Release) {
      if (!micro.empty()) bad();
      return {n.op, std::stoll(t.substr(0, i)), 0};
    }
    if (micro.empty() || micro.size() > 9 ||
        !std::all_of(micro.begin(), micro.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }))
      bad();
    return {n.op, std::stoll(t.substr(0, i)), std::stoll(micro)};
  }
  bad();
  return {};
}

int64_t Schedule::rank_of(int64_t stage) const {
  if (placement == Placement::loop) return stage % pp;
  return stage < pp ? stage : 2 * pp - 1 - stage;
}

bool Schedule::split_backward(int64_t stage, int64_t micro) const {
  const std::vector<Action>& row = ranks[static_cast<size_t>(rank_of(stage))];
  return std::find(row.begin(), row.end(), Action{Op::I, stage, micro}) != row.end();
}

std::vector<Action> held_offloaded_forwards(const std::vector<Action>& row, int64_t resident) {
  std::vector<Action> offloaded;
  std::set<std::pair<int64_t, int64_t>> on_device;  // (stage, micro-batch) held resident
  for (const Action& a : row) {
    if (a.op == Op::F) {
      if (static_cast<int64_t>(on_device.size()) < resident)
        on_device.insert({a.stage, a.micro});
      else
        offloaded.push_back(a);
    } else if (a.op == Op::B || a.op == Op::I) {
      on_device.erase({a.stage, a.micro});
    }
  }
  return offloaded;
}

std::vector<int64_t> held_offloaded_by_stage(const Schedule& schedule, int64_t resident) {
  std::vector<int64_t> out(static_cast<size_t>(schedule.stages()), 0);
  for (const std::vector<Action>& row : schedule.ranks)
    for (const Action& a : held_offloaded_forwards(row, resident)) ++out[static_cast<size_t>(a.stage)];
  return out;
}

void add_communication(Schedule& s) {
  for (int64_t r = 0; r < static_cast<int64_t>(s.ranks.size()); ++r) {
    std::vector<Action> out;
    for (const Action& a : s.ranks[r]) {
      if (a.is_parameter()) out.push_back(a);
      if (!a.is_compute()) continue;
      const bool forward = a.op == Op::F, input_grad = a.op == Op::B || a.op == Op::I;
      // Receive just before the consumer.
      if (forward && a.stage > 0 && s.rank_of(a.stage - 1) != r) out.push_back({Op::RecvF, a.stage, a.micro});
      if (input_grad && a.stage + 1 < s.stages() && s.rank_of(a.stage + 1) != r)
        out.push_back({Op::RecvB, a.stage, a.micro});
      out.push_back(a);
      // Send just after the producer.
      if (forward && a.stage + 1 < s.stages() && s.rank_of(a.stage + 1) != r) out.push_back({Op::SendF, a.stage, a.micro});
      if (input_grad && a.stage > 0 && s.rank_of(a.stage - 1) != r) out.push_back({Op::SendB, a.stage, a.micro});
    }
    s.ranks[r] = std::move(out);
  }
}

void add_parameter_actions(Schedule& s, Gathers gathers) {
  for (std::vector<Action>& row : s.ranks) {
    std::vector<Action> out;
    // The gather point of the last compute action (ahead of its receive, if one is right before
    // it): per_step issues a stage's GATHER there, one compute action ahead of its own.
    std::optional<size_t> ahead;
    std::vector<int64_t> last_compute(static_cast<size_t>(s.stages()), -1);  // per stage, in `row`
    for (size_t i = 0; i < row.size(); ++i)
      if (row[i].is_compute()) last_compute[row[i].stage] = static_cast<int64_t>(i);
    std::vector<bool> gathered(static_cast<size_t>(s.stages()), false);
    for (size_t i = 0; i < row.size(); ++i) {
      const Action& a = row[i];
      if (a.is_parameter()) continue;
      if (a.is_compute()) {
        const bool after_receive = !out.empty() && (out.back().op == Op::RecvF || out.back().op == Op::RecvB);
        const size_t own = out.size() - (after_receive ? 1 : 0);
        if (gathers == Gathers::per_action)
          out.insert(out.begin() + static_cast<std::ptrdiff_t>(own), Action{Op::Gather, a.stage, 0});
        if (gathers == Gathers::per_step && !gathered[a.stage]) {
          gathered[a.stage] = true;
          out.insert(out.begin() + static_cast<std::ptrdiff_t>(ahead.value_or(own)), Action{Op::Gather, a.stage, 0});
        }
        ahead = out.size() - (after_receive ? 1 : 0);
      }
      out.push_back(a);
      const bool release = (gathers == Gathers::per_action && a.is_compute()) ||
                           (gathers == Gathers::per_step && static_cast<int64_t>(i) == last_compute[a.stage]);
      if (release) out.push_back({Op::Release, a.stage, 0});
    }
    out.push_back({Op::Optim, 0, 0});
    row = std::move(out);
  }
}

std::string to_csv(const Schedule& s) {
  std::string out;
  for (const auto& actions : s.ranks) {
    for (size_t i = 0; i < actions.size(); ++i) out += (i ? "," : "") + actions[i].str();
    out += "\n";
  }
  return out;
}

Schedule read_schedule_csv(const std::string& path, int64_t pp, int64_t v, int64_t micro_batches, Placement placement) {
  require_regular_file(path);
  std::ifstream in(path);
  require(in.good(), path, ": cannot open the pipeline schedule file");
  return read_schedule_csv(in, path, pp, v, micro_batches, placement);
}

Schedule read_schedule_csv(std::istream& in, const std::string& path, int64_t pp, int64_t v, int64_t micro_batches,
                           Placement placement) {
  Schedule s;
  s.name = "file:" + path;
  s.pp = pp;
  s.v = v;
  s.micro_batches = micro_batches;
  s.placement = placement;
  std::string line;
  int64_t row = 0;
  bool has_communication = false;
  while (std::getline(in, line)) {
    ++row;
    if (trimmed(line).empty()) continue;
    std::vector<Action> actions;
    std::stringstream cells(line);
    std::string cell;
    int64_t column = 0;
    while (std::getline(cells, cell, ',')) {
      ++column;
      if (trimmed(cell).empty()) continue;
      actions.push_back(parse_action(cell, path + ": row " + std::to_string(row) + ", cell " + std::to_string(column)));
      has_communication = has_communication || actions.back().is_transfer();
    }
    s.ranks.push_back(std::move(actions));
  }
  require(static_cast<int64_t>(s.ranks.size()) == pp, path, ": ", s.ranks.size(), " rows, but parallel.pp = ", pp,
          " (one row per pipeline rank)");
  if (!has_communication) add_communication(s);
  return s;
}

std::string format_grid(const Schedule& s, bool compute_only, int64_t mark_rank, int64_t mark_index) {
  std::vector<std::vector<std::string>> cells(s.ranks.size());
  size_t width = 1;
  for (size_t r = 0; r < s.ranks.size(); ++r) {
    for (size_t i = 0; i < s.ranks[r].size(); ++i) {
      const Action& a = s.ranks[r][i];
      const bool marked = static_cast<int64_t>(r) == mark_rank && static_cast<int64_t>(i) == mark_index;
      if (compute_only && a.is_transfer() && !marked) continue;
      cells[r].push_back(marked ? "[" + a.str() + "]" : a.str());
      width = std::max(width, cells[r].back().size());
    }
  }
  std::ostringstream out;
  for (size_t r = 0; r < cells.size(); ++r) {
    out << "rank " << r << (r < 10 ? " " : "") << " |";
    for (const std::string& c : cells[r]) out << " " << std::string(width - c.size(), ' ') << c;
    out << "\n";
  }
  return out.str();
}

}  // namespace tessera::pipeline
