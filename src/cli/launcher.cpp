#include "cli/launcher.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

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

int launch_workers(const LaunchOptions& o, const std::string& run_dir, double stop_grace_s) {
  require(o.nproc >= 1, "--nproc must be at least 1 (got ", o.nproc, ")");
  require(o.nnodes >= 1, "--nnodes must be at least 1 (got ", o.nnodes, ")");
  require(o.node_rank >= 0 && o.node_rank < o.nnodes, "--node-rank ", o.node_rank, " is outside 0..", o.nnodes - 1);
  require(o.nnodes == 1 || !o.master.empty(), "--nnodes ", o.nnodes,
          " needs --master HOST:PORT (the address of node 0, where rank 0 serves the rendezvous store)");
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
  const int world = o.nproc * o.nnodes;
  comm::ListenSocket store;
  if (o.node_rank == 0) {
    store = comm::listen_on(host, port);
    port = store.port;
  }
  const std::string log_dir = run_dir + "/logs";
  fs::create_directories(log_dir);

  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);

  const std::vector<std::string> argv = worker_command_line();
  std::vector<pid_t> pids;
  std::vector<std::string> outputs;
  for (int local = 0; local < o.nproc; ++local) {
    const int rank = o.node_rank * o.nproc + local;
    comm::LaunchInfo worker;
    worker.rank = rank;
    worker.world_size = world;
    worker.local_rank = local;
    worker.local_world_size = o.nproc;
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
  std::cerr << "tessera: started ranks " << o.node_rank * o.nproc << ".." << o.node_rank * o.nproc + o.nproc - 1
            << " of " << world << " (store " << host << ":" << port << "); other ranks' output in " << log_dir
            << "/\n";

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
    return kStoppedExitCode;
  }
  if (result.interrupted && result.first_failure < 0) {
    std::cerr << "tessera: interrupted; the workers did not all stop with a checkpoint within " << stop_grace_s
              << " s (parallel.timeout_s) and were stopped\n";
    return 130;
  }
  if (result.first_failure >= 0) {
    const int i = result.first_failure;
    const ChildExit& exit = result.exits[static_cast<size_t>(i)];
    std::cerr << "error: rank " << o.node_rank * o.nproc + i << " (pid " << pids[static_cast<size_t>(i)] << ") "
              << exit.describe() << "; stopped the other workers\n";
    if (!outputs[static_cast<size_t>(i)].empty())
      std::cerr << "last lines of " << outputs[static_cast<size_t>(i)] << ":\n"
                << tail_of(outputs[static_cast<size_t>(i)], 12);
    return exit.code > 0 ? exit.code : 1;
  }
  return 0;
}

}  // namespace tessera::cli
