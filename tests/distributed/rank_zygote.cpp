#include "rank_zygote.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "core/error.h"

namespace tessera::test {
namespace {

int zygote_socket = -1;  // the test process's end of the pair; -1 without a zygote
pid_t test_process = 0;
bool forked = false;     // in a rank the zygote started
std::mutex request_mutex;
constexpr size_t kMaxRequest = 1 << 20;

// A request: spec's fields as length-prefixed strings (argv, then env as key and value, then the
// output file), then the inherit_fd number and the process-group flag.
void put(std::string& out, const std::string& s) {
  const uint32_t n = static_cast<uint32_t>(s.size());
  out.append(reinterpret_cast<const char*>(&n), sizeof(n));
  out += s;
}

std::string get(const std::string& in, size_t& at) {
  uint32_t n = 0;
  std::memcpy(&n, in.data() + at, sizeof(n));
  at += sizeof(n);
  std::string s = in.substr(at, n);
  at += n;
  return s;
}

std::string encode(const ChildSpec& spec) {
  std::string out;
  put(out, std::to_string(spec.argv.size()));
  for (const std::string& a : spec.argv) put(out, a);
  put(out, std::to_string(spec.env.size()));
  for (const auto& [key, value] : spec.env) {
    put(out, key);
    put(out, value);
  }
  put(out, spec.output_file);
  put(out, std::to_string(spec.inherit_fd));
  put(out, spec.own_process_group ? "1" : "0");
  return out;
}

ChildSpec decode(const std::string& in) {
  ChildSpec spec;
  size_t at = 0;
  const size_t args = std::stoul(get(in, at));
  for (size_t i = 0; i < args; ++i) spec.argv.push_back(get(in, at));
  const size_t vars = std::stoul(get(in, at));
  for (size_t i = 0; i < vars; ++i) {
    std::string key = get(in, at);
    spec.env[key] = get(in, at);
  }
  spec.output_file = get(in, at);
  spec.inherit_fd = std::stoi(get(in, at));
  spec.own_process_group = get(in, at) == "1";
  return spec;
}

// Sends `data` with descriptor `fd` (none when negative) as one message.
bool send_message(int sock, const void* data, size_t size, int fd) {
  iovec iov{const_cast<void*>(data), size};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  if (fd >= 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  }
  ssize_t n;
  do n = ::sendmsg(sock, &msg, MSG_NOSIGNAL);
  while (n < 0 && errno == EINTR);
  return n == static_cast<ssize_t>(size);
}

// Receives one message of at most `max` bytes into `data` and the descriptor sent with it (-1 when
// none). Returns its size, 0 at the end of the stream, -1 on an error.
ssize_t receive_message(int sock, size_t max, std::string& data, int& fd) {
  data.resize(max);
  iovec iov{data.data(), data.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n;
  do n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  while (n < 0 && errno == EINTR);
  fd = -1;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c))
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) std::memcpy(&fd, CMSG_DATA(c), sizeof(int));
  data.resize(n > 0 ? static_cast<size_t>(n) : 0);
  return n;
}

// In a new rank, once reparented to the test process: what exec would have given it. Returns its
// argv.
std::vector<std::string> become_rank(const ChildSpec& spec, int passed_fd) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != test_process) ::_exit(127);  // the test process died before prctl took effect
  for (const auto& [key, value] : spec.env) ::setenv(key.c_str(), value.c_str(), 1);
  if (!spec.output_file.empty()) {
    const int out = ::open(spec.output_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (out < 0) {
      std::fprintf(stderr, "rank zygote: cannot open %s for a rank's output: %s\n", spec.output_file.c_str(),
                   std::strerror(errno));
      ::_exit(127);
    }
    ::dup2(out, STDOUT_FILENO);
    ::dup2(out, STDERR_FILENO);
    ::close(out);
  }
  if (passed_fd >= 0) {
    if (passed_fd == spec.inherit_fd) {
      ::fcntl(passed_fd, F_SETFD, 0);
    } else {
      ::dup2(passed_fd, spec.inherit_fd);  // the copy is not close-on-exec, as spawn() leaves it
      ::close(passed_fd);
    }
  }
  if (spec.own_process_group) ::setpgid(0, 0);
  forked = true;
  return spec.argv;
}

// The zygote's loop. Returns only in a rank it started, with that rank's argv.
std::vector<std::string> serve(int sock) {
  for (;;) {
    std::string request;
    int passed_fd = -1;
    if (receive_message(sock, kMaxRequest, request, passed_fd) <= 0) ::_exit(0);  // the test process is gone
    int32_t reply = 0;
    int pid_pipe[2];
    if (::pipe2(pid_pipe, O_CLOEXEC) != 0) {
      reply = -errno;
    } else {
      const pid_t middle = ::fork();
      if (middle == 0) {
        const pid_t self = ::getpid();
        const pid_t rank = ::fork();
        if (rank == 0) {
          ::close(pid_pipe[0]);
          ::close(pid_pipe[1]);
          ::close(sock);
          while (::getppid() == self) ::usleep(20);  // until the middle process has exited
          return become_rank(decode(request), passed_fd);
        }
        const int32_t sent = rank > 0 ? rank : -errno;
        (void)!::write(pid_pipe[1], &sent, sizeof(sent));
        ::_exit(0);
      }
      reply = -errno;
      ::close(pid_pipe[1]);
      if (middle > 0) {
        if (::read(pid_pipe[0], &reply, sizeof(reply)) != sizeof(reply)) reply = -EPIPE;
        ::waitpid(middle, nullptr, 0);  // after this the rank is the test process's child
      }
      ::close(pid_pipe[0]);
    }
    if (passed_fd >= 0) ::close(passed_fd);
    if (!send_message(sock, &reply, sizeof(reply), -1)) ::_exit(0);
  }
}

}  // namespace

bool rank_zygote_wanted() {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  return false;
#else
  const char* exec_ranks = std::getenv("TESSERA_TEST_EXEC_RANKS");
  return !(exec_ranks && std::string(exec_ranks) == "1");
#endif
}

void start_rank_zygote(int& argc, char**& argv) {
  if (!rank_zygote_wanted() || std::getenv("TESSERA_TEST_RANK")) return;
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0 || ::prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) {
    std::fprintf(stderr, "rank zygote not started (%s): ranks are exec'd\n", std::strerror(errno));
    return;
  }
  test_process = ::getpid();
  const pid_t zygote = ::fork();
  if (zygote != 0) {
    ::close(pair[1]);
    if (zygote < 0) {
      std::fprintf(stderr, "rank zygote not started (fork: %s): ranks are exec'd\n", std::strerror(errno));
      ::close(pair[0]);
      return;
    }
    zygote_socket = pair[0];
    return;
  }
  ::close(pair[0]);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != test_process) ::_exit(0);
  static std::vector<std::string> args;
  static std::vector<char*> pointers;
  args = serve(pair[1]);
  for (std::string& a : args) pointers.push_back(a.data());
  pointers.push_back(nullptr);
  argc = static_cast<int>(args.size());
  argv = pointers.data();
}

pid_t spawn_rank(const ChildSpec& spec) {
  if (zygote_socket < 0) return spawn(spec);
  const std::string request = encode(spec);
  require(request.size() <= kMaxRequest, "internal: a rank's request of ", request.size(), " bytes");
  std::lock_guard<std::mutex> lock(request_mutex);
  require(send_message(zygote_socket, request.data(), request.size(), spec.inherit_fd),
          "cannot reach the rank zygote: ", std::strerror(errno));
  std::string reply;
  int none = -1;
  const ssize_t n = receive_message(zygote_socket, sizeof(int32_t), reply, none);
  require(n == sizeof(int32_t), "the rank zygote did not answer (", n < 0 ? std::strerror(errno) : "it exited", ")");
  int32_t pid = 0;
  std::memcpy(&pid, reply.data(), sizeof(pid));
  require(pid > 0, "the rank zygote could not start ", spec.argv[0], ": ", std::strerror(-pid));
  return pid;
}

bool rank_zygote_running() { return zygote_socket >= 0; }
bool forked_rank() { return forked; }

}  // namespace tessera::test
