#include "comm/rendezvous.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "core/error.h"

namespace tessera::comm {
namespace {

const char* env(const char* name) {
  const char* value = std::getenv(name);
  return value && *value ? value : nullptr;
}

int64_t env_int(const char* name, int64_t fallback) {
  const char* value = env(name);
  if (!value) return fallback;
  char* end = nullptr;
  const long long parsed = std::strtoll(value, &end, 10);
  require(end && *end == '\0', "environment variable ", name, "=\"", value, "\" is not an integer");
  return parsed;
}

sockaddr_storage resolve(const std::string& host, int port, socklen_t& length) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  require(rc == 0 && found, "cannot resolve the address \"", host, "\": ", gai_strerror(rc));
  sockaddr_storage out{};
  std::memcpy(&out, found->ai_addr, found->ai_addrlen);
  length = found->ai_addrlen;
  freeaddrinfo(found);
  return out;
}

}  // namespace

std::string LaunchInfo::describe() const {
  std::ostringstream s;
  s << "rank " << rank << " of " << world_size << " (local " << local_rank << " of " << local_world_size << ", "
    << launcher << ")";
  if (world_size > 1) s << ", store " << master_addr << ":" << master_port;
  return s.str();
}

LaunchInfo launch_info_from_environment() {
  LaunchInfo info;
  if (env("TESSERA_LAUNCHER")) {
    info.launcher = "tessera";
  } else if (env("TORCHELASTIC_RUN_ID") || (env("RANK") && env("WORLD_SIZE"))) {
    info.launcher = "torchrun";
  } else if (env("OMPI_COMM_WORLD_RANK") || env("PMI_RANK")) {
    info.launcher = "mpirun";
  } else if (env("SLURM_PROCID") && env_int("SLURM_NTASKS", 1) > 1) {
    info.launcher = "srun";
  }
  if (info.launcher == "tessera" || info.launcher == "torchrun") {
    info.rank = env_int("RANK", 0);
    info.world_size = env_int("WORLD_SIZE", 1);
    info.local_rank = env_int("LOCAL_RANK", 0);
    info.local_world_size = env_int("LOCAL_WORLD_SIZE", 1);
    info.store_fd = static_cast<int>(env_int("TESSERA_STORE_FD", -1));
    const char* agent = env("TORCHELASTIC_USE_AGENT_STORE");
    info.agent_store = agent && std::string(agent) == "True";
  } else if (info.launcher == "mpirun") {
    const bool ompi = env("OMPI_COMM_WORLD_RANK") != nullptr;
    info.rank = env_int(ompi ? "OMPI_COMM_WORLD_RANK" : "PMI_RANK", 0);
    info.world_size = env_int(ompi ? "OMPI_COMM_WORLD_SIZE" : "PMI_SIZE", 1);
    info.local_rank = env_int(ompi ? "OMPI_COMM_WORLD_LOCAL_RANK" : "MPI_LOCALRANKID", 0);
    info.local_world_size = env_int(ompi ? "OMPI_COMM_WORLD_LOCAL_SIZE" : "MPI_LOCALNRANKS", 1);
  } else if (info.launcher == "srun") {
    info.rank = env_int("SLURM_PROCID", 0);
    info.world_size = env_int("SLURM_NTASKS", 1);
    info.local_rank = env_int("SLURM_LOCALID", 0);
    info.local_world_size = env_int("SLURM_NTASKS_PER_NODE", 1);
  }
  if (const char* addr = env("MASTER_ADDR")) info.master_addr = addr;
  info.master_port = env_int("MASTER_PORT", 0);
  require(info.world_size >= 1 && info.rank >= 0 && info.rank < info.world_size, "launched by ", info.launcher,
          " with rank ", info.rank, " outside a world of ", info.world_size);
  if (info.world_size > 1)
    require(info.master_port > 0 || info.store_fd >= 0, "launched by ", info.launcher, " as ", info.describe(),
            " but MASTER_PORT is not set: export MASTER_ADDR and MASTER_PORT (the host and port rank 0 serves the ",
            "store on), or start the workers with `tessera train --nproc N --master HOST:PORT`");
  return info;
}

int64_t processes_per_node(int64_t configured) {
  return configured > 0 ? configured : launch_info_from_environment().local_world_size;
}

std::map<std::string, std::string> worker_environment(const LaunchInfo& w, int store_fd) {
  std::map<std::string, std::string> env = {{"TESSERA_LAUNCHER", "1"},
                                            {"RANK", std::to_string(w.rank)},
                                            {"WORLD_SIZE", std::to_string(w.world_size)},
                                            {"LOCAL_RANK", std::to_string(w.local_rank)},
                                            {"LOCAL_WORLD_SIZE", std::to_string(w.local_world_size)},
                                            {"MASTER_ADDR", w.master_addr},
                                            {"MASTER_PORT", std::to_string(w.master_port)}};
  if (w.rank == 0) env["TESSERA_STORE_FD"] = std::to_string(store_fd);
  return env;
}

ListenSocket listen_on(const std::string& host, int port) {
  socklen_t length = 0;
  sockaddr_storage address = resolve(host, port, length);
  const int fd = ::socket(address.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  require(fd >= 0, "cannot create a socket for ", host, ":", port, ": ", std::strerror(errno));
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), length) != 0 || ::listen(fd, 1024) != 0) {
    const int err = errno;
    ::close(fd);
    fail("cannot listen on ", host, ":", port, " for the rendezvous store: ", std::strerror(err),
         port != 0 ? " (is another run using this port?)" : "");
  }
  sockaddr_storage bound{};
  socklen_t bound_length = sizeof(bound);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &bound_length);
  ListenSocket out;
  out.fd = fd;
  out.port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                               : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  return out;
}

std::string local_address_towards(const std::string& host) {
  socklen_t length = 0;
  sockaddr_storage remote = resolve(host, 9, length);
  const int fd = ::socket(remote.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  require(fd >= 0, "cannot create a socket towards ", host, ": ", std::strerror(errno));
  sockaddr_storage local{};
  socklen_t local_length = sizeof(local);
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&remote), length) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_length) == 0;
  ::close(fd);
  require(ok, "no route from this host to ", host, " (MASTER_ADDR): ", std::strerror(errno));
  char text[INET6_ADDRSTRLEN] = {};
  const void* raw = local.ss_family == AF_INET6 ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr)
                                                : static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr);
  ::inet_ntop(local.ss_family, raw, text, sizeof(text));
  return text;
}

}  // namespace tessera::comm
