// How this process learns its place in the world, and how ranks find each other.
//
// launch_info_from_environment() recognises, in this order:
//   tessera train --nproc   TESSERA_LAUNCHER=1 plus the torchrun variables below, and
//                           TESSERA_STORE_FD: the store's listening socket, bound by the launcher
//   torchrun                RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT
//                           (TORCHELASTIC_USE_AGENT_STORE=True: the agent serves the store)
//   mpirun (Open MPI)       OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK / _LOCAL_SIZE
//   mpirun (MPICH, Hydra)   PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS
//   srun (Slurm)            SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE
// and otherwise a single process. MPI and Slurm do not say where the store is: they need
// MASTER_ADDR and MASTER_PORT (or --master host:port), and the error says so.
//
// The store (c10d TCPStore) is served by rank 0 on a socket bound to MASTER_ADDR only, never to
// every interface: rank 0 binds it itself (or inherits the launcher's) and hands it to TCPStore.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace tessera::comm {

struct LaunchInfo {
  int64_t rank = 0, world_size = 1;
  int64_t local_rank = 0, local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int64_t master_port = 0;
  int store_fd = -1;             // inherited listening socket for the store (rank 0 only)
  bool agent_store = false;      // the launcher's agent serves the store (torchrun)
  std::string launcher = "single";  // single, tessera, torchrun, mpirun, srun

  std::string describe() const;  // "rank 1 of 4 (local 1 of 2, torchrun), store 10.0.0.1:29500"
};

LaunchInfo launch_info_from_environment();

// Processes per node (global ranks fill nodes in order): `configured` when positive
// (parallel.ranks_per_node), else the launcher's LOCAL_WORLD_SIZE (1 where no launcher says).
int64_t processes_per_node(int64_t configured);

// The environment a tessera-launched worker reads back through launch_info_from_environment():
// TESSERA_LAUNCHER plus the torchrun variables, and for global rank 0 TESSERA_STORE_FD =
// `store_fd` (the inherited listening socket; the caller also keeps that fd open across exec).
std::map<std::string, std::string> worker_environment(const LaunchInfo& worker, int store_fd);

// A TCP socket bound to host:port and listening (port 0 picks a free one). Throws naming the
// address when it cannot bind.
struct ListenSocket {
  int fd = -1;
  int port = 0;
};
ListenSocket listen_on(const std::string& host, int port);

// The local address that routes to `host` (the address Gloo should bind for traffic to peers).
std::string local_address_towards(const std::string& host);

}  // namespace tessera::comm
