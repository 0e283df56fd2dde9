// TESSERA_FAULT (fault_injection.h).
#include "core/fault_injection.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <vector>

#include "core/error.h"

namespace tessera::fault {
namespace {

struct Target {
  int64_t rank = 0;
  std::string point;
  int64_t step = 0;
  int signal = 0;
  std::string signal_name;
};

std::atomic<bool> armed{false};
std::atomic<bool> fired{false};
std::atomic<int64_t> current_step{0};
Target target;  // written once by arm(), before `armed`

const std::vector<std::string>& phase_points() {
  static const std::vector<std::string> points = {"forward",   "backward",   "optimizer",   "checkpoint.write",
                                                  "swap.load", "swap.store", "swarm.group", "swarm.reduce",
                                                  "swarm.sum"};
  return points;
}

const std::vector<std::string>& comm_ops() {
  static const std::vector<std::string> ops = {"all_reduce", "broadcast", "all_gather", "reduce_scatter",
                                               "all_to_all", "send", "recv", "barrier"};
  return ops;
}

bool known_point(const std::string& point) {
  const auto& phases = phase_points();
  if (std::find(phases.begin(), phases.end(), point) != phases.end()) return true;
  const size_t dot = point.find('.');
  if (dot == std::string::npos) return false;
  // A group's name (a mesh dimension, "world") is lower case with underscores; "*" is any group.
  const std::string group = point.substr(0, dot), op = point.substr(dot + 1);
  const bool group_name = group == "*" || (!group.empty() && std::all_of(group.begin(), group.end(), [](char c) {
                                             return (c >= 'a' && c <= 'z') || c == '_';
                                           }));
  return group_name && std::find(comm_ops().begin(), comm_ops().end(), op) != comm_ops().end();
}

std::vector<std::string> split(const std::string& text, char by) {
  std::vector<std::string> out;
  std::stringstream in(text);
  std::string part;
  while (std::getline(in, part, by)) out.push_back(part);
  return out;
}

int64_t whole_number(const std::string& text, const std::string& value, const char* what) {
  require(!text.empty() && std::all_of(text.begin(), text.end(), ::isdigit) && text.size() < 10,
          "TESSERA_FAULT=", value, ": ", what, " '", text, "' is not a whole number");
  return std::stoll(text);
}

void fire(const std::string& point) {
  if (fired.exchange(true)) return;
  const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::fprintf(stderr, "tessera: TESSERA_FAULT: rank %lld sends itself SIG%s at %s in step %lld (at %.3f)\n",
               static_cast<long long>(target.rank), target.signal_name.c_str(), point.c_str(),
               static_cast<long long>(current_step.load()), now);
  std::fflush(stderr);
  std::raise(target.signal);
}

}  // namespace

void arm(int64_t rank) {
  const char* raw = std::getenv("TESSERA_FAULT");
  if (!raw || !*raw) return;
  const std::string value = raw;
  const std::vector<std::string> parts = split(value, ':');
  require(parts.size() == 4, "TESSERA_FAULT=", value, ": expected RANK:POINT:STEP:SIGNAL (e.g. 1:pp.send:3:STOP)");
  const int64_t victim = whole_number(parts[0], value, "RANK");
  require(known_point(parts[1]), "TESSERA_FAULT=", value, ": unknown point '", parts[1],
          "' (forward, backward, optimizer, checkpoint.write, swap.load, swap.store, swarm.group, swarm.reduce, "
          "swarm.sum, or <group>.<op> of a mesh "
          "group: core/fault_injection.h)");
  target.point = parts[1];
  target.step = whole_number(parts[2], value, "STEP");
  require(target.step >= 1, "TESSERA_FAULT=", value, ": STEP counts from 1");
  if (parts[3] == "KILL") target.signal = SIGKILL;
  else if (parts[3] == "STOP") target.signal = SIGSTOP;
  else fail("TESSERA_FAULT=", value, ": SIGNAL '", parts[3], "' is neither KILL nor STOP");
  target.signal_name = parts[3];
  target.rank = rank;
  armed = victim == rank;
}

void at_step(int64_t step) { current_step = step; }

void point(const char* point) {
  if (!armed.load(std::memory_order_relaxed) || current_step < target.step || target.point != point) return;
  fire(point);
}

void comm_point(const std::string& group, const std::string& op) {
  if (!armed.load(std::memory_order_relaxed) || current_step < target.step) return;
  const std::string kind = op.substr(0, op.find(' ')), name = group.substr(0, group.find('/')) + "." + kind;
  if (name == target.point || target.point == "*." + kind) fire(name);
}

}  // namespace tessera::fault
