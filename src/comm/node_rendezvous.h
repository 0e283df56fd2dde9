// How the launchers of one run across nodes (`tessera train --nproc N --nnodes M --node-rank K
// --master HOST:PORT`) agree on who runs, generation by generation, so that a failure anywhere
// stops every node's workers and parallel.max_restarts restarts the run on what is left.
//
// The launchers' store (a c10d TCPStore) is served by node 0's launcher on the --master address
// for the launcher's whole life; the other launchers are its clients. Through it:
//   generation 0  every launcher joins with its --nproc; node 0's waits for all M (up to
//                 parallel.timeout_s), checks that they agree, and publishes the generation: each
//                 node's first rank and worker count, and the port of the generation's workers'
//                 store (rank 0 serves it from a socket node 0's launcher binds: a fresh port each
//                 generation, so no worker of an old generation reaches a new one);
//   its end       the first launcher whose workers fail, or that is interrupted, records how (`end`:
//                 the first record wins); every other launcher sees it within one poll (`ended`)
//                 and stops its workers;
//   generation k  after a failure (parallel.max_restarts) every launcher still alive joins; node
//                 0's waits for the previous generation's nodes up to parallel.timeout_s, then
//                 publishes next_generation() of those that joined (and of any other node that
//                 joined by then), or a refusal that ends every launcher;
//   growth        a launcher started for a node that is not in the current generation (its host
//                 came back) joins the next one and asks for it (`request_growth`); node 0's
//                 launcher ends the current generation with a checkpoint (its workers stop as on
//                 SIGTERM, every rank at the same step) and publishes the next one with that node.
// Node 0's launcher is the one the others cannot lose (as the store host of torchrun's c10d
// rendezvous): when it is gone, the others say so and exit.
//
// Invariants: generation numbers count up from 0 in steps of one; a published generation never
// changes; ranks are contiguous per node, in node order.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>

namespace tessera::comm {

struct NodeSlot {
  int64_t first_rank = 0;
  int64_t nproc = 0;
};

struct Generation {
  int64_t number = 0;             // 0: the first start; k: restart k
  std::map<int, NodeSlot> nodes;  // node rank -> its ranks (nodes without workers are absent)
  int64_t world = 0;
  int store_port = 0;             // this generation's workers' store, on node 0's --master host
  int64_t step = -1;              // restart: the checkpoint it continues from
  int64_t restarts = 0;           // failures restarted up to this generation (a rejoined node's are not)
  std::string announcement;       // restart: what every launcher prints ("restart 1 of 2: ...")
  std::string refusal;            // not empty: there is no such generation, and why
};

// How a generation ended, as recorded by the launcher that saw it first.
struct GenerationEnd {
  int node = 0;              // whose workers failed (or whose launcher was interrupted, or who rejoined)
  bool restartable = false;  // a worker failed (not an interrupt), or a node rejoined
  bool growth = false;       // a node rejoined: the workers stopped with a checkpoint, none failed
  std::string failure;       // "rank 3 (pid 812) on node 1 killed by signal 9 (SIGKILL)", or "node 1's launcher rejoined"
  int code = 1;              // the exit code every launcher gives when the run ends there
};

// What next_generation() needs of the run: replicas of `model_parallel` ranks (world / dp),
// parallel.max_restarts, and the run directory (for messages).
struct RestartPolicy {
  int64_t model_parallel = 1;
  int64_t max_restarts = 0;
  std::string run_dir;
};

// Generation 0 from each node's --nproc (`joined`, node -> nproc) for a run of `nnodes` nodes:
// refused when a node is missing or runs a different number of workers than node 0.
Generation first_generation(const std::map<int, int64_t>& joined, int nnodes, int store_port);

// The generation after `previous` ended with `end`, from the nodes that joined it (node -> the
// worker count it brings): a node of `previous` keeps its workers, less the failed one on end.node
// (unless a node of `previous` did not join: its loss explains the failure, and the first worker to
// fail elsewhere failed on it); a node new to it (rejoined) brings its own; the world is cut to whole data-parallel replicas
// by taking workers from the highest nodes. Refused when no replica is left or there is no
// checkpoint (`step` < 0) to continue from.
Generation next_generation(const Generation& previous, const GenerationEnd& end, const std::map<int, int64_t>& joined,
                           const RestartPolicy& policy, int64_t step);

class NodeRendezvous {
 public:
  // Node 0 serves the store on host:port; the others connect to it, retrying up to `timeout`.
  NodeRendezvous(const std::string& host, int port, int node_rank, std::chrono::milliseconds timeout);
  ~NodeRendezvous();

  // Every launcher, once per generation, with its worker count.
  void join(int64_t generation, int64_t nproc);
  // Node 0: the nodes of 0..nnodes-1 that joined `generation` (node -> nproc), waiting until every
  // node of `wait_for` has or the timeout passes.
  std::map<int, int64_t> collect(int64_t generation, const std::set<int>& wait_for, int nnodes);
  // Node 0: publishes a generation; it becomes the current one.
  void publish(const Generation& generation);
  // The number of the last published generation, if any (a launcher that finds one is late: it
  // rejoins a running run).
  std::optional<int64_t> current();
  // A late launcher, after joining generation + 1: asks node 0 to end `generation` for it.
  void request_growth(int64_t generation);
  // Node 0: the node that asked to end `generation` for it, if any (-1 while none did, or while the
  // store cannot be reached).
  int growth_requested(int64_t generation);
  // Every launcher but node 0's: the generation node 0 publishes (waits up to twice the timeout,
  // since node 0 may itself wait that long for the others).
  Generation await(int64_t generation);

  // Records `mine` unless an end is recorded already; returns the one recorded first.
  GenerationEnd end(int64_t generation, const GenerationEnd& mine);
  // The end recorded, if any (none while the store cannot be reached: the caller's own workers
  // decide then).
  std::optional<GenerationEnd> ended(int64_t generation);

  std::string address() const { return address_; }

 private:
  std::string address_;  // "host:port", for messages
  int node_rank_;
  std::chrono::milliseconds timeout_;
  struct Store;  // the TCPStore (node_rendezvous.cpp)
  std::unique_ptr<Store> store_;
};

}  // namespace tessera::comm
