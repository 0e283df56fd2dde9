#include "core/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include "core/error.h"

extern char** environ;

namespace tessera {

namespace {

// Whether process `pid` is stopped (SIGSTOP, SIGTSTP, a debugger): state T or t in /proc/PID/stat.
bool stopped_by_signal(pid_t pid) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", static_cast<int>(pid));
  FILE* file = std::fopen(path, "r");
  if (!file) return false;
  char line[512] = {};
  const size_t n = std::fread(line, 1, sizeof(line) - 1, file);
  std::fclose(file);
  const char* close = std::strrchr(line, ')');  // the command name may hold spaces and parentheses
  return n > 0 && close && close[1] == ' ' && (close[2] == 'T' || close[2] == 't');
}

}  // namespace

pid_t spawn(const ChildSpec& spec) {
  require(!spec.argv.empty(), "internal: spawn without a program");
  std::map<std::string, std::string> merged;
  for (char** e = environ; *e; ++e) {
    const std::string entry(*e);
    const size_t eq = entry.find('=');
    if (eq != std::string::npos) merged[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  for (const auto& [key, value] : spec.env) merged[key] = value;
  std::vector<std::string> env_strings;
  for (const auto& [key, value] : merged) env_strings.push_back(key + "=" + value);
  std::vector<char*> envp, argv;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = spec.argv;
  for (auto& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);

  int out_fd = -1;
  if (!spec.output_file.empty()) {
    out_fd = ::open(spec.output_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    require(out_fd >= 0, spec.output_file, ": cannot open for the output of ", spec.argv[0], ": ", std::strerror(errno));
  }
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);  // the parent died before prctl took effect
    if (out_fd >= 0) {
      ::dup2(out_fd, STDOUT_FILENO);
      ::dup2(out_fd, STDERR_FILENO);
    }
    if (spec.inherit_fd >= 0) ::fcntl(spec.inherit_fd, F_SETFD, 0);
    if (spec.own_process_group) ::setpgid(0, 0);
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  const int err = errno;
  if (out_fd >= 0) ::close(out_fd);
  require(pid > 0, "cannot start ", spec.argv[0], ": ", std::strerror(err));
  return pid;
}

std::string ChildExit::describe() const {
  if (code >= 0) return "exited with code " + std::to_string(code);
  const char* name = sigabbrev_np(signal);
  return "killed by signal " + std::to_string(signal) + (name ? std::string(" (SIG") + name + ")" : "");
}

SuperviseResult supervise(const std::vector<pid_t>& pids, const SuperviseOptions& options) {
  using Clock = std::chrono::steady_clock;
  SuperviseResult result;
  result.exits.resize(pids.size());
  std::vector<bool> done(pids.size(), false);
  size_t remaining = pids.size();
  const auto start = Clock::now();
  bool stopping = false;
  Clock::time_point stop_started;

  auto stop_all = [&](int sig) {
    for (size_t i = 0; i < pids.size(); ++i)
      if (!done[i]) {
        ::kill(pids[i], sig);
        result.exits[i].stopped_by_supervisor = true;
      }
  };
  double grace_s = options.grace_s;
  auto begin_stop = [&]() {
    if (stopping) return;
    stopping = true;
    stop_started = Clock::now();
    stop_all(SIGTERM);
  };

  while (remaining > 0) {
    // Of the children found failed in one sweep, one killed by a signal is the likelier cause:
    // a worker that lost a peer exits with an error of its own moments after the peer's death.
    int sweep_failure = -1;
    for (size_t i = 0; i < pids.size(); ++i) {
      if (done[i]) continue;
      int status = 0;
      const pid_t got = ::waitpid(pids[i], &status, WNOHANG);
      if (got != pids[i]) continue;
      done[i] = true;
      --remaining;
      ChildExit& exit = result.exits[i];
      exit.pid = pids[i];
      if (WIFEXITED(status)) {
        exit.code = WEXITSTATUS(status);
      } else {
        exit.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
      }
      const bool ok = std::find(options.ok_codes.begin(), options.ok_codes.end(), exit.code) != options.ok_codes.end();
      if (!ok && !exit.stopped_by_supervisor && result.first_failure < 0 &&
          (sweep_failure < 0 || (exit.signal != 0 && result.exits[static_cast<size_t>(sweep_failure)].signal == 0)))
        sweep_failure = static_cast<int>(i);
    }
    if (sweep_failure >= 0) {
      result.first_failure = sweep_failure;
      if (options.stop_on_failure) begin_stop();
    }
    if (remaining == 0) break;
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    if (options.interrupted && *options.interrupted && !result.interrupted) {
      result.interrupted = true;
      if (!stopping) grace_s = options.interrupt_grace_s;
      begin_stop();
    }
    if (options.outside && !stopping && result.outside == SuperviseOptions::Outside::none) {
      result.outside = options.outside();
      if (result.outside == SuperviseOptions::Outside::checkpoint) grace_s = options.interrupt_grace_s;
      if (result.outside != SuperviseOptions::Outside::none) begin_stop();
    }
    if (options.deadline_s > 0 && elapsed > options.deadline_s && !result.timed_out) {
      result.timed_out = true;
      stop_all(SIGKILL);
    }
    if (stopping && std::chrono::duration<double>(Clock::now() - stop_started).count() > grace_s)
      stop_all(SIGKILL);
    if (stopping)  // a stopped child cannot act on its SIGTERM: the grace would only be waited out
      for (size_t i = 0; i < pids.size(); ++i)
        if (!done[i] && stopped_by_signal(pids[i])) ::kill(pids[i], SIGKILL);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return result;
}

}  // namespace tessera
