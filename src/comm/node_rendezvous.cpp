// The launchers' store and the generations they agree on (node_rendezvous.h).
#include "comm/node_rendezvous.h"

#include <algorithm>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "comm/rendezvous.h"
#include "core/error.h"

namespace tessera::comm {
namespace {

std::string key(int64_t generation, const std::string& what) {
  return "tessera/nodes/" + std::to_string(generation) + "/" + what;
}

std::string workers_text(int64_t n) { return std::to_string(n) + (n == 1 ? " worker" : " workers"); }

nlohmann::json to_json(const Generation& g) {
  nlohmann::json nodes = nlohmann::json::object();
  for (const auto& [node, slot] : g.nodes) nodes[std::to_string(node)] = {slot.first_rank, slot.nproc};
  return {{"number", g.number},   {"nodes", nodes},         {"world", g.world},
          {"store_port", g.store_port}, {"step", g.step}, {"restarts", g.restarts},
          {"announcement", g.announcement}, {"refusal", g.refusal}};
}

Generation generation_from_json(const nlohmann::json& j) {
  Generation g;
  g.number = j.at("number");
  for (const auto& [node, slot] : j.at("nodes").items())
    g.nodes[std::stoi(node)] = NodeSlot{slot.at(0).get<int64_t>(), slot.at(1).get<int64_t>()};
  g.world = j.at("world");
  g.store_port = j.at("store_port");
  g.step = j.at("step");
  g.restarts = j.at("restarts");
  g.announcement = j.at("announcement");
  g.refusal = j.at("refusal");
  return g;
}

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string text(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }

// Ranks in node order from each node's worker count (nodes with none left out).
void assign_ranks(Generation& g, const std::map<int, int64_t>& counts) {
  g.nodes.clear();
  g.world = 0;
  for (const auto& [node, n] : counts) {
    if (n <= 0) continue;
    g.nodes[node] = NodeSlot{g.world, n};
    g.world += n;
  }
}

nlohmann::json end_json(const GenerationEnd& e) {
  return {{"node", e.node},       {"restartable", e.restartable}, {"growth", e.growth},
          {"failure", e.failure}, {"code", e.code}};
}

GenerationEnd end_from_json(const nlohmann::json& j) {
  return GenerationEnd{j.at("node"), j.at("restartable"), j.at("growth"), j.at("failure"), j.at("code")};
}

}  // namespace

Generation first_generation(const std::map<int, int64_t>& joined, int nnodes, int store_port) {
  Generation g;
  g.store_port = store_port;
  std::vector<int> missing;
  for (int node = 0; node < nnodes; ++node)
    if (!joined.count(node)) missing.push_back(node);
  if (!missing.empty()) {
    std::ostringstream out;
    out << "the launchers of node(s)";
    for (int node : missing) out << " " << node;
    out << " did not join within parallel.timeout_s (start `tessera train --nproc N --nnodes " << nnodes
        << " --node-rank K --master HOST:PORT` on every node, with node 0's address)";
    g.refusal = out.str();
    return g;
  }
  const int64_t nproc = joined.at(0);
  for (const auto& [node, n] : joined)
    if (n != nproc) {
      g.refusal = "node " + std::to_string(node) + "'s launcher has --nproc " + std::to_string(n) + " and node 0's " +
                  std::to_string(nproc) + ": every node runs the same number of workers";
      return g;
    }
  assign_ranks(g, joined);
  return g;
}

Generation next_generation(const Generation& previous, const GenerationEnd& end, const std::map<int, int64_t>& joined,
                           const RestartPolicy& policy, int64_t step) {
  Generation g;
  g.number = previous.number + 1;
  g.store_port = previous.store_port;
  g.step = step;
  g.restarts = previous.restarts + (end.growth ? 0 : 1);
  std::vector<int> lost;
  for (const auto& [node, slot] : previous.nodes)
    if (!joined.count(node)) lost.push_back(node);
  // A lost node explains the failure: the worker that failed first elsewhere failed on its loss.
  const int failed_node = end.restartable && !end.growth && lost.empty() ? end.node : -1;
  std::map<int, int64_t> counts;
  int64_t total = 0;
  for (const auto& [node, nproc] : joined) {
    const auto was = previous.nodes.find(node);
    counts[node] = was == previous.nodes.end() ? nproc : was->second.nproc - (node == failed_node ? 1 : 0);
    total += counts[node];
  }
  int64_t cut = total % policy.model_parallel;  // whole replicas only
  for (auto it = counts.rbegin(); it != counts.rend() && cut > 0; ++it) {
    const int64_t take = std::min(it->second, cut);
    it->second -= take;
    cut -= take;
  }
  assign_ranks(g, counts);
  if (step < 0) {
    g.refusal = "the run has no checkpoint in " + policy.run_dir + "/checkpoints to continue from";
    return g;
  }
  if (g.world < 1) {
    g.refusal = "no whole replica of " + std::to_string(policy.model_parallel) +
                (policy.model_parallel == 1 ? " rank" : " ranks") + " is left";
    return g;
  }
  std::ostringstream out;
  if (!end.growth) out << "restart " << g.restarts << " of " << policy.max_restarts << ": ";
  out << end.failure << "; continuing from checkpoint step " << step << " on " << workers_text(g.world)
      << " (parallel.dp " << g.world / policy.model_parallel << ")";
  if (previous.nodes.size() > 1 || g.nodes.size() > 1) {
    out << ": ";
    for (auto it = g.nodes.begin(); it != g.nodes.end(); ++it)
      out << (it == g.nodes.begin() ? "" : ", ") << "node " << it->first << " " << workers_text(it->second.nproc);
    for (int node : lost) out << "; node " << node << "'s launcher did not rejoin within parallel.timeout_s";
  }
  g.announcement = out.str();
  return g;
}

struct NodeRendezvous::Store {
  c10::intrusive_ptr<c10d::TCPStore> tcp;
};

NodeRendezvous::NodeRendezvous(const std::string& host, int port, int node_rank, std::chrono::milliseconds timeout)
    : address_(host + ":" + std::to_string(port)), node_rank_(node_rank), timeout_(timeout), store_(new Store) {
  c10d::TCPStoreOptions options;
  options.port = static_cast<uint16_t>(port);
  options.isServer = node_rank == 0;
  options.waitWorkers = false;
  options.timeout = timeout;
  if (options.isServer) options.masterListenFd = listen_on(host, port).fd;  // bound to --master's host only
  try {
    store_->tcp = c10::make_intrusive<c10d::TCPStore>(host, options);
  } catch (const std::exception& e) {
    fail("node ", node_rank, ": cannot reach the launchers' store of node 0 at ", address_, " within parallel.timeout_s (",
         timeout.count() / 1000.0, " s): ", e.what());
  }
}

NodeRendezvous::~NodeRendezvous() = default;

void NodeRendezvous::join(int64_t generation, int64_t nproc) {
  store_->tcp->set(key(generation, "join/" + std::to_string(node_rank_)), bytes(std::to_string(nproc)));
}

std::map<int, int64_t> NodeRendezvous::collect(int64_t generation, const std::set<int>& wait_for, int nnodes) {
  std::map<int, int64_t> joined;
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  for (;;) {
    for (int node = 0; node < nnodes; ++node) {
      const std::string k = key(generation, "join/" + std::to_string(node));
      if (!joined.count(node) && store_->tcp->check({k})) joined[node] = std::stoll(text(store_->tcp->get(k)));
    }
    bool all = true;
    for (int node : wait_for) all = all && joined.count(node);
    if (all || std::chrono::steady_clock::now() > deadline) return joined;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

void NodeRendezvous::publish(const Generation& generation) {
  store_->tcp->set(key(generation.number, "plan"), bytes(to_json(generation).dump()));
  store_->tcp->set("tessera/nodes/current", bytes(std::to_string(generation.number)));
}

std::optional<int64_t> NodeRendezvous::current() {
  if (!store_->tcp->check({"tessera/nodes/current"})) return std::nullopt;
  return std::stoll(text(store_->tcp->get("tessera/nodes/current")));
}

void NodeRendezvous::request_growth(int64_t generation) {
  store_->tcp->set(key(generation, "growth"), bytes(std::to_string(node_rank_)));
}

int NodeRendezvous::growth_requested(int64_t generation) {
  try {
    const std::string k = key(generation, "growth");
    return store_->tcp->check({k}) ? std::stoi(text(store_->tcp->get(k))) : -1;
  } catch (const std::exception&) {
    return -1;
  }
}

Generation NodeRendezvous::await(int64_t generation) {
  const std::string k = key(generation, "plan");
  const auto deadline = std::chrono::steady_clock::now() + 2 * timeout_;
  try {
    while (!store_->tcp->check({k})) {
      if (std::chrono::steady_clock::now() > deadline)
        fail("node ", node_rank_, ": node 0's launcher (", address_, ") published no generation ", generation, " within ",
             2 * timeout_.count() / 1000.0, " s (twice parallel.timeout_s)");
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return generation_from_json(nlohmann::json::parse(text(store_->tcp->get(k))));
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    fail("node ", node_rank_, ": lost node 0's launcher (the launchers' store at ", address_,
         ") while waiting for generation ", generation, ": ", e.what());
  }
}

GenerationEnd NodeRendezvous::end(int64_t generation, const GenerationEnd& mine) {
  try {
    return end_from_json(nlohmann::json::parse(
        text(store_->tcp->compareSet(key(generation, "end"), {}, bytes(end_json(mine).dump())))));
  } catch (const std::exception& e) {
    fail("node ", node_rank_, ": lost node 0's launcher (the launchers' store at ", address_,
         ") at the end of generation ", generation, " (", mine.failure, "): ", e.what());
  }
}

std::optional<GenerationEnd> NodeRendezvous::ended(int64_t generation) {
  try {
    const std::string k = key(generation, "end");
    if (!store_->tcp->check({k})) return std::nullopt;
    return end_from_json(nlohmann::json::parse(text(store_->tcp->get(k))));
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

}  // namespace tessera::comm
