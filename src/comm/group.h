// comm::Group: one process group and the only way tessera code talks to other ranks.
//
// A Group wraps one c10d backend (Gloo on the CPU, NCCL on CUDA; one per group, built on a
// PrefixStore named after the group, comm/mesh.h) behind named collectives. Invariants:
// - Every collective of a group runs on that group's own communication thread, in the order the
//   caller issued it. All ranks issue the same collectives in the same order, so the order on
//   the wire is the same everywhere, and a caller can overlap communication with compute by
//   holding the returned Work and waiting later (gradient buckets during backward).
// - Tensors passed to an async call must stay alive and untouched until its Work is waited.
// - A failure (a dead peer, a timeout after parallel.timeout_s) surfaces from Work::wait as a
//   tessera::Error naming the global rank, the group and the operation. After a failure the group
//   is unusable; the caller is expected to end the process.
// - Every operation is recorded in the flight recorder (comm/flight_recorder.h) when it starts and
//   when it ends; a failed one stays open there, as what this rank was in.
// - A group of size 1 has no backend: every collective is the identity (or a copy).
// - Gloo has no real reduce-scatter (c10d emulates it with a full all-reduce); reduce_scatter
//   on a Gloo group is a ring over send/recv that sends (N-1)/N of the input per rank and holds
//   2/N of it beyond input and output while it runs (none at N = 2; it only reads the input). Gloo
//   point-to-point runs on the caller's thread (its tags keep it apart from the queue).
// - When a Work completes, the operation holds no memory any more: the queued body and its
//   tensors are destroyed first and, on Gloo, the backend's worker thread has dropped the
//   operation (its staging buffers are freed), so a memory count taken after wait() is exact.
// - traffic() counts the bytes this rank sent, per operation, by the ring algorithm's volume:
//   all_reduce 2(N-1)/N * bytes, all_gather and reduce_scatter (N-1)/N * full bytes, broadcast
//   `bytes` on the root, send_recv `bytes` (counted as "send"), all_to_all (N-1)/N * input bytes
//   (the chunks that leave this rank; with variable splits, the rows sent to other members).
//   Once the members' nodes are set (set_member_nodes), inter_node_bytes() counts the part of the
//   all-to-alls with variable splits sent to members on other nodes.
// - All-to-alls take bfloat16 on Gloo too (moved as float16 of the same bits: Gloo has no bf16
//   all-to-all).
//
// A CUDA group (`device` is a GPU; NCCL) adds, for streams and ordering:
// - Its communication thread has the group's GPU as current device and a pool stream of its own
//   as current stream (the "comm stream"). Point-to-point runs on that thread too, in issue
//   order, as one coalesced NCCL group per call (a ring step's send and receive together), and
//   so does a composite operation's body (run_async), whose kernels go to the comm stream.
// - Issue: the calling thread records an event on its current stream; the comm stream waits on
//   it before the operation, so the operation reads what every kernel queued before the call
//   wrote. (ProcessGroupNCCL orders its NCCL stream after the calling thread's current stream,
//   which on the communication thread is the comm stream.)
// - Completion: c10d's WorkNCCL::wait(timeout) makes the comm stream wait on the NCCL stream and
//   then blocks the communication thread until the NCCL kernels finished (or throws after the
//   timeout). The thread then synchronizes the comm stream (the avg division, staging copies)
//   before it completes the Work. So when Work::wait() returns, all GPU work of the operation has
//   finished: kernels the caller queues afterwards, on any stream, see the result. No stream of
//   the caller is made to wait on the NCCL stream.
// - A CPU tensor given to a CUDA group travels through a copy on the group's GPU (the losses and
//   norms the trainer reduces as CPU scalars).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

namespace tessera::comm {

enum class ReduceOp { sum, avg, max };

class Work {
 public:
  Work() = default;
  explicit Work(std::shared_future<void> done) : done_(std::move(done)) {}
  // Blocks until the operation finished; rethrows its tessera::Error. A default Work is done.
  void wait();
  bool pending() const { return done_.valid(); }
  // Whether it finished (a default Work has), without waiting. A Gloo send or receive posted to the
  // backend (send_async, recv_async) is finished only by its wait: Gloo's point-to-point work
  // reports completion from wait() alone.
  bool ready() const {
    return !done_.valid() || done_.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  }

 private:
  std::shared_future<void> done_;
};

class Group {
 public:
  struct Impl;
  // `ranks`: the members' global ranks, ascending; `rank`: this process's index in `ranks`.
  // `backend` may be null only when ranks.size() == 1. `device`: where the backend communicates,
  // the CPU for Gloo, this process's GPU (with an index) for NCCL.
  Group(std::string name, std::vector<int64_t> ranks, int64_t rank, c10::intrusive_ptr<c10d::Backend> backend,
        std::chrono::milliseconds timeout, c10::Device device = c10::Device(c10::kCPU));
  ~Group();
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

  const std::string& name() const;
  int64_t rank() const;
  int64_t size() const;
  int64_t global_rank_of(int64_t rank) const;  // a member
  const std::vector<int64_t>& ranks() const;
  c10::Device device() const;

  // In place on `tensor` (contiguous).
  Work all_reduce_async(at::Tensor tensor, ReduceOp op = ReduceOp::sum);
  void all_reduce(at::Tensor tensor, ReduceOp op = ReduceOp::sum) { all_reduce_async(tensor, op).wait(); }
  // Many tensors in one call (flattened into one message per dtype).
  void all_reduce(std::vector<at::Tensor> tensors, ReduceOp op = ReduceOp::sum);
  void broadcast(at::Tensor tensor, int64_t root);
  // output: size() * input.numel() elements, member i's input at [i * n, (i + 1) * n).
  Work all_gather_async(at::Tensor output, at::Tensor input);
  void all_gather(at::Tensor output, at::Tensor input) { all_gather_async(output, input).wait(); }
  // input: size() * output.numel() elements; output = reduction over members of chunk rank(); the
  // two must not overlap.
  Work reduce_scatter_async(at::Tensor output, at::Tensor input, ReduceOp op = ReduceOp::sum);
  void reduce_scatter(at::Tensor output, at::Tensor input, ReduceOp op = ReduceOp::sum) {
    reduce_scatter_async(output, input, op).wait();
  }
  // input, output: the same number of elements, a multiple of size(), seen as size() equal chunks
  // along dim 0 of a flat view; member i's chunk j lands in member j's output chunk i.
  Work all_to_all_async(at::Tensor output, at::Tensor input);
  void all_to_all(at::Tensor output, at::Tensor input) { all_to_all_async(output, input).wait(); }
  // Variable splits along dim 0 (expert dispatch): input's first input_rows[j] rows go to member
  // j, in member order; output receives output_rows[i] rows from member i, in member order. The
  // counts must agree pairwise (member i's input_rows[j] == member j's output_rows[i]); any may
  // be zero, and a member may send and receive nothing. Other dims equal, both contiguous.
  Work all_to_all_async(at::Tensor output, at::Tensor input, std::vector<int64_t> output_rows,
                        std::vector<int64_t> input_rows);
  // Point to point with group-local peer ranks; a send and a recv are matched by `tag` (Gloo) or
  // by issue order (NCCL). Both are posted at once and waited together, so a ring step cannot
  // deadlock.
  void send_recv(at::Tensor send, int64_t to, at::Tensor recv, int64_t from, int64_t tag = 0);
  // One direction only, blocking (a pipeline of ranks: LASP's state ring, parallel/sequence).
  void send(at::Tensor tensor, int64_t to, int64_t tag = 0);
  // A send posted now and completed in the background (pipeline schedules: a rank goes on
  // computing while its activation travels); wait() on the Work before `tensor` changes or dies.
  // Gloo: posted on the caller's thread, waited by Work::wait; NCCL: on the communication thread.
  Work send_async(at::Tensor tensor, int64_t to, int64_t tag = 0);
  void recv(at::Tensor tensor, int64_t from, int64_t tag = 0);
  // A receive posted now, so the data lands while the caller computes; read `tensor` after wait().
  // Gloo: posted to the backend at once (matched by tag). NCCL matches by issue order on the one
  // communication thread, where a receive posted ahead would hold up the sends queued behind it:
  // there it is issued when waited, as recv() would be.
  Work recv_async(at::Tensor tensor, int64_t from, int64_t tag = 0);
  void barrier();
  // A composite operation named `op` (see the invariants above). `body` may issue this group's
  // collectives (they run inline and their Work is already done when returned) and compute; the
  // tensors it touches follow the async rules. Its exceptions surface from the returned Work.
  Work run_async(const std::string& op, std::function<void()> body);

  // Bytes this rank sent, by operation name ("all_reduce", "all_gather", ...).
  std::map<std::string, int64_t> traffic() const;
  int64_t bytes_sent() const;
  int64_t inter_node_bytes() const;  // all-to-all bytes to other nodes (0 when the nodes are not set)
  // Seconds the communication thread spent running queued operations (busy time, whether or not
  // the caller was waiting: compare with the exposed wait to get the overlap).
  double busy_seconds() const;
  void reset_traffic();  // clears bytes and busy time

  // Called once, on the group's first failed operation, and appended to its message: who is to
  // blame (comm/heartbeat.h). Set by the mesh before any operation.
  void set_failure_diagnosis(std::function<std::string()> diagnose);
  // The node of each member (size() entries), for the inter-node traffic count; set while no
  // operation is in flight.
  void set_member_nodes(std::vector<int64_t> node_of_member);

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace tessera::comm
