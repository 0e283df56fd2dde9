#include "cli/launcher.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

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

// One round of workers: spawned, supervised to their end, and the launcher's exit code.
struct Round {
  int code = 0;
  bool failed = false;  // a worker failed (not a stop, not an interrupt): a restart may follow
  std::string failure;  // "rank 1 (pid ...) killed by signal 9 (SIGKILL)"
};

Round run_workers(const LaunchOptions& o, int nproc, const std::string& host, int port, comm::ListenSocket store,
                  const std::vector<std::string>& argv, const std::string& run_dir, double stop_grace_s) {
  const int world = nproc * o.nnodes;
  const std::string log_dir = run_dir + "/logs";
  std::vector<pid_t> pids;
  std::vector<std::string> outputs;
  for (int local = 0; local < nproc; ++local) {
    const int rank = o.node_rank * nproc + local;
    comm::LaunchInfo worker;
    worker.rank = rank;
    worker.world_size = world;
    worker.local_rank = local;
    worker.local_world_size = nproc;
    worker.master_addr = host;
    worker.master_port = port;
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
  std::cerr << "tessera: started ranks " << o.node_rank * nproc << ".." << o.node_rank * nproc + nproc - 1 << " of "
            << world << " (store " << host << ":" << port << "); other ranks' output in " << log_dir << "/\n";

  SuperviseOptions options;
  options.interrupted = &g_interrupted;
  options.interrupt_grace_s = stop_grace_s;
  options.ok_codes = {0, kStoppedExitCode};
  const SuperviseResult result = supervise(pids, options);
  bool all_stopped = true;
  for (const ChildExit& exit : result.exits) all_stopped = all_stopped && exit.code == kStoppedExitCode;
  if (all_stopped) {
    std::cerr << "tessera: the workers stopped early with a checkpoint; continue with `tessera train --resume " << run_dir
              << "`\n";
    return Round{kStoppedExitCode, false, ""};
  }
  if (result.interrupted && result.first_failure < 0) {
    std::cerr << "tessera: interrupted; the workers did not all stop with a checkpoint within " << stop_grace_s
              << " s (parallel.timeout_s) and were stopped\n";
    return Round{130, false, ""};
  }
  if (result.first_failure >= 0) {
    const int i = result.first_failure;
    const ChildExit& exit = result.exits[static_cast<size_t>(i)];
    Round round{exit.code > 0 ? exit.code : 1, !result.interrupted, ""};
    round.failure = "rank " + std::to_string(o.node_rank * nproc + i) + " (pid " +
                    std::to_string(pids[static_cast<size_t>(i)]) + ") " + exit.describe();
    std::cerr << "error: " << round.failure << "; stopped the other workers\n";
    if (!outputs[static_cast<size_t>(i)].empty())
      std::cerr << "last lines of " << outputs[static_cast<size_t>(i)] << ":\n"
                << tail_of(outputs[static_cast<size_t>(i)], 12);
    return round;
  }
  return Round{0, false, ""};
}

// The step of the run's latest checkpoint (RUN_DIR/checkpoints/latest names step_N), or -1.
int64_t latest_checkpoint_step(const std::string& run_dir) {
  std::ifstream in(run_dir + "/checkpoints/latest");
  std::string name;
  if (!(in >> name) || name.rfind("step_", 0) != 0 || !fs::is_directory(run_dir + "/checkpoints/" + name)) return -1;
  try {
    return std::stoll(name.substr(5));
  } catch (const std::exception&) {
    return -1;
  }
}

}  // namespace

int launch_workers(const LaunchOptions& o, const std::string& run_dir, double stop_grace_s, const Restarts& restarts) {
  require(o.nproc >= 1, "--nproc must be at least 1 (got ", o.nproc, ")");
  require(o.nnodes >= 1, "--nnodes must be at least 1 (got ", o.nnodes, ")");
  require(o.node_rank >= 0 && o.node_rank < o.nnodes, "--node-rank ", o.node_rank, " is outside 0..", o.nnodes - 1);
  require(o.nnodes == 1 || !o.master.empty(), "--nnodes ", o.nnodes,
          " needs --master HOST:PORT (the address of node 0, where rank 0 serves the rendezvous store)");
  require(restarts.max == 0 || o.nnodes == 1, "parallel.max_restarts = ", restarts.max, " restarts the workers of one "
          "node; with --nnodes ", o.nnodes, " the nodes' launchers cannot agree on the survivors yet: set it to 0");
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

  std::vector<std::string> argv = worker_command_line();
  int nproc = o.nproc;
  for (int64_t restart = 1;; ++restart) {
    comm::ListenSocket store;
    int round_port = port;
    if (o.node_rank == 0) {
      store = comm::listen_on(host, restart == 1 ? port : 0);  // a restart takes a fresh port
      round_port = store.port;
    }
    const Round round = run_workers(o, nproc, host, round_port, store, argv, run_dir, stop_grace_s);
    if (!round.failed || restart > restarts.max) return round.code;
    // Restart: the workers that are left, in whole data-parallel replicas, from the last checkpoint.
    const int64_t step = latest_checkpoint_step(run_dir);
    const int next = static_cast<int>((nproc - 1) / restarts.model_parallel * restarts.model_parallel);
    if (step < 0 || next < 1) {
      std::cerr << "tessera: not restarting (parallel.max_restarts): "
                << (step < 0 ? "the run has no checkpoint in " + run_dir + "/checkpoints to continue from"
                             : "no whole replica of " + std::to_string(restarts.model_parallel) + " ranks is left")
                << "\n";
      return round.code;
    }
    std::cerr << "tessera: restart " << restart << " of " << restarts.max << ": " << round.failure
              << "; continuing from checkpoint step " << step << " on " << next << " workers (parallel.dp "
              << next / restarts.model_parallel << ")\n";
    std::ofstream(run_dir + "/metrics.jsonl", std::ios::app)
        << nlohmann::json{{"step", step}, {"restart", restart}, {"world", next}, {"failure", round.failure}}.dump()
        << "\n";
    argv = {argv.front(), "train", "--resume", run_dir, "--set", "parallel.dp=0"};
    nproc = next;
  }
}

}  // namespace tessera::cli
