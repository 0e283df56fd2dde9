#include "cli/launcher.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "comm/node_rendezvous.h"
#include "comm/rendezvous.h"
#include "core/error.h"
#include "train/stop_request.h"
#include "core/subprocess.h"

namespace tessera::cli {
namespace fs = std::filesystem;

namespace {

std::atomic<bool> g_interrupted{false};
void on_signal(int) { g_interrupted = true; }

// This process's command line without the launcher's own flags (both "--flag value" and
// "--flag=value" forms).
std::vector<std::string> worker_command_line() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::vector<std::string> args;
  for (std::string arg; std::getline(in, arg, '\0');) args.push_back(arg);
  const std::vector<std::string> launcher_flags = {"--nproc", "--nnodes", "--node-rank", "--master"};
  std::vector<std::string> out{fs::read_symlink("/proc/self/exe").string()};
  for (size_t i = 1; i < args.size(); ++i) {
    bool skip = false;
    for (const auto& flag : launcher_flags) {
      if (args[i] == flag) {
        skip = true;
        ++i;  // its value
      } else if (args[i].rfind(flag + "=", 0) == 0) {
        skip = true;
      }
    }
    if (!skip) out.push_back(args[i]);
  }
  return out;
}

std::string tail_of(const std::string& path, size_t max_lines) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  std::ostringstream out;
  for (size_t i = lines.size() > max_lines ? lines.size() - max_lines : 0; i < lines.size(); ++i)
    out << "  | " << lines[i] << "\n";
  return out.str();
}

}  // namespace

namespace {

// One generation's workers on this node: spawned, supervised to their end, and how it ended.
struct Round {
  int code = 0;
  bool failed = false;       // a worker here failed (not a stop, not an interrupt): a restart may follow
  bool interrupted = false;  // Ctrl-C or SIGTERM on this launcher
  std::string failure;       // "rank 1 (pid ...) killed by signal 9 (SIGKILL)"
  bool signalled = false;    // the failed worker was killed by a signal (not an exit with an error)
};

// A worker that exits with an error may have failed on another node's loss: a worker killed there
// closes its connections, and its peers' collectives fail moments later, at times before that
// node's launcher has recorded the death. Before recording such a failure as the generation's end,
// its launcher waits up to kPeerFailureGrace for another launcher's record, which names the cause
// (and so the node that runs one worker fewer after a restart); a death by a signal is recorded at once.
constexpr auto kPeerFailureGrace = std::chrono::seconds(2);

comm::GenerationEnd record_end(comm::NodeRendezvous& nodes, int64_t generation, const Round& round, int node) {
  if (round.failed && !round.signalled) {
    const auto deadline = std::chrono::steady_clock::now() + kPeerFailureGrace;
    while (std::chrono::steady_clock::now() < deadline) {
      if (std::optional<comm::GenerationEnd> end = nodes.ended(generation)) return *end;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  return nodes.end(generation, {node, round.failed, false, round.failure, round.code});
}

// During a generation across nodes: whether another launcher ended it (a failure: stop the workers;
// a node rejoining: stop them with a checkpoint), and on node 0, with restarts, whether a late
// launcher asked to rejoin (then node 0 ends it so).
SuperviseOptions::Outside watch(comm::NodeRendezvous& nodes, int64_t generation, bool take_growth) {
  using Outside = SuperviseOptions::Outside;
  std::optional<comm::GenerationEnd> end = nodes.ended(generation);
  if (!end && take_growth) {
    const int node = nodes.growth_requested(generation);
    if (node >= 0)
      end = nodes.end(generation, {node, true, true, "node " + std::to_string(node) + "'s launcher rejoined", 0});
  }
  if (!end) return Outside::none;
  return end->growth ? Outside::checkpoint : Outside::failed;
}

Round run_workers(const LaunchOptions& o, const comm::Generation& generation, const std::string& host,
                  comm::ListenSocket store, const std::vector<std::string>& argv, const std::string& run_dir,
                  double stop_grace_s, comm::NodeRendezvous* nodes, bool take_growth) {
  const comm::NodeSlot slot = generation.nodes.at(o.node_rank);
  const std::string log_dir = run_dir + "/logs";
  std::vector<pid_t> pids;
  std::vector<std::string> outputs;
  for (int64_t local = 0; local < slot.nproc; ++local) {
    const int64_t rank = slot.first_rank + local;
    comm::LaunchInfo worker;
    worker.rank = rank;
    worker.world_size = generation.world;
    worker.local_rank = local;
    worker.local_world_size = slot.nproc;
    worker.master_addr = host;
    worker.master_port = generation.store_port;
    ChildSpec spec;
    spec.argv = argv;
    spec.own_process_group = true;
    spec.env = comm::worker_environment(worker, store.fd);
    if (rank == 0) spec.inherit_fd = store.fd;
    if (local != 0) spec.output_file = log_dir + "/rank_" + std::to_string(rank) + ".out";
    outputs.push_back(spec.output_file);
    pids.push_back(spawn(spec));
  }
  if (store.fd >= 0) ::close(store.fd);
  std::cerr << "tessera: started ranks " << slot.first_rank << ".." << slot.first_rank + slot.nproc - 1 << " of "
            << generation.world << " (store " << host << ":" << generation.store_port << "); other ranks' output in "
            << log_dir << "/\n";

  SuperviseOptions options;
  options.interrupted = &g_interrupted;
  options.interrupt_grace_s = stop_grace_s;
  options.ok_codes = {0, kStoppedExitCode};
  if (nodes)
    options.outside = [nodes, &generation, take_growth] { return watch(*nodes, generation.number, take_growth); };
  const SuperviseResult result = supervise(pids, options);
  bool all_stopped = true;
  for (const ChildExit& exit : result.exits) all_stopped = all_stopped && exit.code == kStoppedExitCode;
  if (all_stopped) return Round{kStoppedExitCode, false, false, ""};
  if (result.interrupted && result.first_failure < 0) {
    std::cerr << "tessera: interrupted; the workers did not all stop with a checkpoint within " << stop_grace_s
              << " s (parallel.timeout_s) and were stopped\n";
    return Round{130, false, true, "the launcher of node " + std::to_string(o.node_rank) + " was interrupted"};
  }
  if (result.first_failure >= 0) {
    const size_t i = static_cast<size_t>(result.first_failure);
    const ChildExit& exit = result.exits[i];
    Round round{exit.code > 0 ? exit.code : 1, !result.interrupted, result.interrupted, ""};
    round.signalled = exit.signal != 0;
    round.failure = "rank " + std::to_string(slot.first_rank + static_cast<int64_t>(i)) + " (pid " +
                    std::to_string(pids[i]) + ")" + (nodes ? " on node " + std::to_string(o.node_rank) : "") + " " +
                    exit.describe();
    std::cerr << "error: " << round.failure << "; stopped the other workers\n";
    if (!outputs[i].empty()) std::cerr << "last lines of " << outputs[i] << ":\n" << tail_of(outputs[i], 12);
    return round;
  }
  if (result.outside != SuperviseOptions::Outside::none) return Round{1, false, false, "stopped from another node"};
  return Round{0, false, false, ""};
}

}  // namespace

int launch_workers(const LaunchOptions& o, const std::string& run_dir, double stop_grace_s, const Restarts& restarts) {
  require(o.nproc >= 1, "--nproc must be at least 1 (got ", o.nproc, ")");
  require(o.nnodes >= 1, "--nnodes must be at least 1 (got ", o.nnodes, ")");
  require(o.node_rank >= 0 && o.node_rank < o.nnodes, "--node-rank ", o.node_rank, " is outside 0..", o.nnodes - 1);
  require(o.nnodes == 1 || !o.master.empty(), "--nnodes ", o.nnodes,
          " needs --master HOST:PORT (the address of node 0, whose launcher serves the launchers' store)");
  std::string host = "127.0.0.1";
  int port = 0;
  if (!o.master.empty()) {
    const size_t colon = o.master.rfind(':');
    require(colon != std::string::npos && colon > 0, "--master \"", o.master, "\" must be HOST:PORT");
    host = o.master.substr(0, colon);
    try {
      port = std::stoi(o.master.substr(colon + 1));
    } catch (const std::exception&) {
      fail("--master \"", o.master, "\": the port is not a number");
    }
    require(port > 0 && port < 65536 && (o.nnodes == 1 || port != 0), "--master \"", o.master,
            "\": the port must be in 1..65535");
  }
  fs::create_directories(run_dir + "/logs");

  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);

  // One node: this launcher decides alone. Several: node 0's launcher serves the launchers' store on
  // --master and each generation's workers' store on a fresh port.
  const bool lead = o.node_rank == 0;
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(stop_grace_s * 1000));
  std::unique_ptr<comm::NodeRendezvous> nodes;
  if (o.nnodes > 1) nodes = std::make_unique<comm::NodeRendezvous>(host, port, o.node_rank, timeout);
  comm::ListenSocket store;
  if (lead) store = comm::listen_on(host, nodes ? 0 : port);
  std::vector<std::string> argv = worker_command_line();
  const std::vector<std::string> resume = {argv.front(), "train", "--resume", run_dir, "--set", "parallel.dp=0"};
  comm::Generation generation;
  std::set<int> all;
  for (int node = 0; node < o.nnodes; ++node) all.insert(node);
  if (!nodes) {
    generation = comm::first_generation({{0, o.nproc}}, 1, store.port);
  } else if (const std::optional<int64_t> current = lead ? std::nullopt : nodes->current()) {
    // The run is going without this node (its host was lost): rejoin it at node 0's next checkpoint.
    require(restarts.max > 0, "node ", o.node_rank, ": the run is already going (generation ", *current,
            ") and parallel.max_restarts = 0: a launcher can rejoin a run only where it restarts");
    require(!nodes->await(*current).nodes.count(o.node_rank), "node ", o.node_rank, " is already running in generation ",
            *current, " of this run: is another launcher running with --node-rank ", o.node_rank, "?");
    nodes->join(*current + 1, o.nproc);
    nodes->request_growth(*current);
    std::cerr << "tessera: node " << o.node_rank << " rejoins the run (generation " << *current
              << "); node 0's launcher stops it at a checkpoint\n";
    generation = nodes->await(*current + 1);
    require(generation.refusal.empty() || generation.nodes.count(o.node_rank), generation.refusal);
    require(generation.nodes.count(o.node_rank), "node ", o.node_rank, " was not taken into generation ",
            generation.number, " (", generation.announcement, ")");
    std::cerr << "tessera: " << generation.announcement << "\n";
    argv = resume;
  } else {
    nodes->join(0, o.nproc);
    if (lead) {
      generation = comm::first_generation(nodes->collect(0, all, o.nnodes), o.nnodes, store.port);
      nodes->publish(generation);
    } else {
      generation = nodes->await(0);
    }
  }
  require(generation.refusal.empty(), generation.refusal);

  for (;;) {
    const Round round = run_workers(o, generation, host, store, argv, run_dir, stop_grace_s, nodes.get(),
                                    lead && restarts.max > 0);
    // How the generation ended: recorded by the first launcher that saw it end (several nodes).
    std::optional<comm::GenerationEnd> end;
    if (nodes && round.code != 0)
      end = round.failed || round.interrupted ? record_end(*nodes, generation.number, round, o.node_rank)
                                              : nodes->ended(generation.number);
    else if (!nodes && round.failed)
      end = comm::GenerationEnd{0, true, false, round.failure, round.code};
    if (!end) {
      if (round.code == kStoppedExitCode)
        std::cerr << "tessera: the workers stopped early with a checkpoint; continue with `tessera train --resume "
                  << run_dir << "`\n";
      return round.code;
    }
    if (end->node != o.node_rank && !end->growth)
      std::cerr << "error: the run failed on node " << end->node << ": " << end->failure << "\n";
    const int code = end->code != 0 ? end->code : 1;  // the failure that ended the run, on every node
    if (!end->restartable || (!end->growth && generation.restarts >= restarts.max)) return code;
    // Restart: the workers that are left (and a node that rejoined), in whole data-parallel
    // replicas, from the last checkpoint.
    const comm::RestartPolicy policy{restarts.model_parallel, restarts.max, run_dir};
    const int64_t next = generation.number + 1;
    if (lead) store = comm::listen_on(host, 0);  // a restart takes a fresh port
    if (!nodes) {
      generation =
          comm::next_generation(generation, *end, {{0, 0}}, policy, latest_checkpoint_step(run_dir + "/checkpoints"));
      generation.store_port = store.port;
    } else {
      nodes->join(next, 0);
      if (lead) {
        std::set<int> previous;
        for (const auto& [node, slot] : generation.nodes) previous.insert(node);
        generation = comm::next_generation(generation, *end, nodes->collect(next, previous, o.nnodes), policy,
                                           latest_checkpoint_step(run_dir + "/checkpoints"));
        generation.store_port = store.port;
        nodes->publish(generation);
      } else {
        generation = nodes->await(next);
      }
    }
    if (!generation.refusal.empty()) {
      std::cerr << "tessera: not restarting (parallel.max_restarts): " << generation.refusal << "\n";
      return code;
    }
    std::cerr << "tessera: " << generation.announcement << "\n";
    if (lead)
      std::ofstream(run_dir + "/metrics.jsonl", std::ios::app)
          << nlohmann::json{{"step", generation.step},
                            {"restart", generation.number},
                            {"world", generation.world},
                            {end->growth ? "rejoined" : "failure", end->growth ? nlohmann::json(end->node)
                                                                               : nlohmann::json(end->failure)}}
                 .dump()
          << "\n";
    if (!generation.nodes.count(o.node_rank)) {
      std::cerr << "tessera: node " << o.node_rank << " has no workers in generation " << generation.number
                << " (whole replicas only); the run goes on without it\n";
      return 0;
    }
    argv = resume;
  }
}

}  // namespace tessera::cli
