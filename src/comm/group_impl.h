// Group::Impl: the state a comm::Group shares with its communication thread, and what every
// operation is made of (staging on CUDA groups, counting traffic, naming a failed operation in the
// flight record, queueing on the thread, the Gloo ring reduce-scatter). Internal to comm/: included
// by group.cpp (the thread, construction, traffic) and group_collectives.cpp (the operations).
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <numeric>
#include <optional>
#include <thread>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "comm/flight_recorder.h"
#include "comm/group.h"
#include "core/error.h"
#include "core/fault_injection.h"

namespace tessera::comm {

// Tags of the ring collectives have this bit set; tags callers pass to send/recv must stay below it.
constexpr int kRingTagBit = 1 << 30;

// "4096 bytes": how an operation's text names its tensor.
inline std::string shape_text(const at::Tensor& t) {
  return std::to_string(t.numel() * static_cast<int64_t>(t.element_size())) + " bytes";
}

// Shared by the Group and its communication thread. The thread keeps it alive, so a Group
// destroyed after a failure can leave a thread that is still blocked in the backend.
struct Group::Impl {
  std::string name;
  std::vector<int64_t> ranks;
  int64_t rank = 0;
  c10::intrusive_ptr<c10d::Backend> backend;
  std::chrono::milliseconds timeout;
  c10::Device device{c10::kCPU};
  std::optional<c10::Stream> comm_stream;  // CUDA groups: set and used by the communication thread only
  std::function<std::string()> diagnose;   // who to blame when an operation fails (may be empty)
  std::vector<int64_t> node_of_member;     // empty: nodes unknown (no inter-node count)

  std::mutex mutex;
  std::condition_variable ready;
  std::deque<std::function<void()>> queue;
  bool stopping = false;
  std::atomic<bool> failed{false};
  std::thread thread;

  std::mutex traffic_mutex;
  std::map<std::string, int64_t> traffic;
  int64_t inter_node_bytes = 0;
  double busy_seconds = 0;
  int64_t ring_tag = 0;  // touched only on the communication thread

  int64_t size() const { return static_cast<int64_t>(ranks.size()); }
  bool on_cuda() const { return device.is_cuda(); }

  static const c10::impl::DeviceGuardImplInterface* cuda() {
    return c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
  }

  // The tensor the backend sees: on a CUDA group a CPU tensor is copied to the group's GPU.
  at::Tensor staged(const at::Tensor& t) const { return t.defined() && on_cuda() && !t.is_cuda() ? t.to(device) : t; }
  // What an all-to-all moves: Gloo has no bfloat16 all-to-all (the process aborts), so bf16 data
  // travels as float16 of the same bits (an all-to-all only copies them).
  at::Tensor on_wire(const at::Tensor& t) const {
    return !on_cuda() && t.scalar_type() == at::kBFloat16 ? t.view(at::kHalf) : t;
  }
  // Copies a staged result back into the caller's tensor.
  static void unstage(const at::Tensor& t, const at::Tensor& staged) {
    if (t.defined() && !staged.is_same(t)) t.copy_(staged);
  }

  [[noreturn]] void fail_op(const std::string& op, const std::string& detail) {
    const bool first = !failed.exchange(true);
    const std::string blame = first && diagnose ? "; " + diagnose() : "";
    fail("rank ", ranks[rank], " (group '", name, "', rank ", rank, " of ", size(), "): ", op, " failed: ", detail, blame);
  }

  void count(const std::string& op, double bytes, double to_other_nodes = 0) {
    std::lock_guard<std::mutex> lock(traffic_mutex);
    traffic[op] += static_cast<int64_t>(bytes);
    inter_node_bytes += static_cast<int64_t>(to_other_nodes);
  }

  void add_busy(std::chrono::steady_clock::time_point start) {
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::lock_guard<std::mutex> lock(traffic_mutex);
    busy_seconds += seconds;
  }

  // Runs `body` (which may throw c10::Error/std::exception from the backend), naming the op on failure.
  // A failed operation stays open in the flight record: it is what this rank was in.
  void guarded(const std::string& op, const std::function<void()>& body) {
    fault::comm_point(name, op);
    const int64_t flight = flight_started(name, op);
    try {
      body();
      flight_ended(name, flight);
    } catch (const Error&) {
      failed = true;
      throw;
    } catch (const std::exception& e) {
      std::string what = e.what();
      if (what.size() > 400) what = what.substr(0, 400) + " ...";
      fail_op(op, what);
    }
  }

  // Waits for a backend operation. On Gloo it then also waits (briefly, at most the group's
  // timeout) until Gloo's worker thread has dropped its reference to the operation, so the
  // operation's buffers are freed with the caller's last reference, before the Work completes.
  void wait_backend(const c10::intrusive_ptr<c10d::Work>& work) {
    if (!work->wait(timeout)) throw std::runtime_error("aborted");
    if (on_cuda()) return;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (work.use_count() > 1 && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  }

  // Posts the send (if `send` is defined) and the receive (if `recv` is), then waits for both;
  // peers are group-local ranks. Gloo: on the caller's thread. NCCL: on the communication thread
  // as one coalesced group, so that neither rank's send waits behind its own receive.
  void point_to_point(const at::Tensor& send, int64_t to, const at::Tensor& recv, int64_t from, int64_t tag) {
    require(tag >= 0 && tag < kRingTagBit, "internal: send/recv tag ", tag, " outside [0, 2^30)");
    require(size() > 1, "group '", name, "' has one member: there is no peer to send to or receive from");
    std::string op = send.defined() ? "send of " + shape_text(send) + " to rank " + std::to_string(to) : "";
    if (recv.defined())
      op += (op.empty() ? "" : ", ") + std::string("recv of ") + shape_text(recv) + " from rank " + std::to_string(from);
    if (on_cuda()) {
      enqueue(op, [this, send, to, recv, from]() {
        const at::Tensor out = staged(send), in = staged(recv);
        std::vector<at::Tensor> outs{out}, ins{in};
        backend->startCoalescing();
        if (out.defined()) backend->send(outs, static_cast<int>(to), 0);
        if (in.defined()) backend->recv(ins, static_cast<int>(from), 0);
        const c10::intrusive_ptr<c10d::Work> both = backend->endCoalescing();
        if (both) wait_backend(both);
        unstage(recv, in);
      }).wait();
    } else {
      guarded(op, [&] {
        c10::intrusive_ptr<c10d::Work> sent, received;
        std::vector<at::Tensor> out{send}, in{recv};
        if (send.defined()) sent = backend->send(out, static_cast<int>(to), static_cast<int>(tag));
        if (recv.defined()) received = backend->recv(in, static_cast<int>(from), static_cast<int>(tag));
        if (sent) wait_backend(sent);
        if (received) wait_backend(received);
      });
    }
    if (send.defined()) count("send", static_cast<double>(send.numel() * send.element_size()));
  }

  // Queues `body` for the communication thread (inside a composite operation, runs it inline). On
  // a CUDA group the caller's current stream is marked here, on the calling thread, and the comm
  // stream waits on the mark before `body`; after `body` the thread synchronizes the comm stream,
  // so a completed Work leaves no GPU work behind (group.h).
  Work enqueue(const std::string& op, std::function<void()> body) {
    if (std::this_thread::get_id() == thread.get_id()) {  // inside a composite operation (run_async)
      if (failed) fail_op(op, "an earlier operation of this group failed");
      guarded(op, body);
      return Work();
    }
    auto promise = std::make_shared<std::promise<void>>();
    Work work(promise->get_future().share());
    std::shared_ptr<c10::Event> issued;
    if (on_cuda()) {
      issued = std::make_shared<c10::Event>(c10::DeviceType::CUDA);
      issued->record(cuda()->getStream(device));
    }
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (failed) fail_op(op, "an earlier operation of this group failed");
      // The body (and the tensors it holds) is destroyed before the Work completes, so memory the
      // operation used is free when the caller's wait returns (exact memory accounting, ZeRO-3).
      queue.push_back([this, op, body = std::move(body), promise, issued]() mutable {
        const auto start = std::chrono::steady_clock::now();
        try {
          guarded(op, [&] {
            if (issued) issued->block(*comm_stream);
            body();
            if (comm_stream) comm_stream->synchronize();
          });
          body = nullptr;
          add_busy(start);
          promise->set_value();
        } catch (...) {
          body = nullptr;
          add_busy(start);
          promise->set_exception(std::current_exception());
        }
      });
    }
    ready.notify_one();
    return work;
  }

  void run_queue() {
    // A thread torch did not create starts with OpenMP's default team size (all cores); the
    // arithmetic of the ring and of averaging must use the process's train.threads setting, or its
    // idle OpenMP workers spin against the training threads.
    at::init_num_threads();
    // Collectives are never part of an autograd graph: the ring's in-place arithmetic on views of
    // tensors made under no_grad (inside autograd functions' forward) must not be recorded here.
    at::NoGradGuard no_grad;
    // A CUDA group's thread works on the group's GPU, on a stream of its own (group.h).
    if (on_cuda()) {
      cuda()->setDevice(device);
      comm_stream = cuda()->getStreamFromGlobalPool(device);
      cuda()->exchangeStream(*comm_stream);
    }
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lock(mutex);
        ready.wait(lock, [&] { return stopping || !queue.empty(); });
        if (queue.empty()) return;
        task = std::move(queue.front());
        queue.pop_front();
      }
      task();
    }
  }

  // Ring reduce-scatter over send/recv: N-1 steps; in step s rank r sends its partial sum of
  // chunk (r - s - 1) mod N to r + 1 and receives from r - 1 the partial of chunk (r - s - 2) mod N,
  // to which it adds its own input's chunk. After the last step chunk r holds the sum over all ranks.
  // The input is only read (output must not overlap it): the partial sums live in two chunk-sized
  // buffers, one sent while the other receives, and the last step receives into the output itself,
  // so a reduction holds at most 2/N of its input beyond input and output (nothing at N = 2).
  void ring_reduce_scatter(at::Tensor output, at::Tensor input) {
    const int64_t n = size();
    const int64_t chunk = output.numel();
    const at::Tensor in = input.reshape({n, chunk});
    const at::Tensor out = output.view({chunk});
    const int64_t next = (rank + 1) % n, prev = (rank + n - 1) % n;
    const int64_t tag_base = ring_tag++ * n;
    at::Tensor partials[2];
    at::Tensor sending = in[((rank - 1) % n + n) % n];
    for (int64_t s = 0; s + 1 < n; ++s) {
      const int64_t recv_chunk = ((rank - s - 2) % n + n) % n;
      at::Tensor& spare = partials[s % 2];
      if (s + 2 < n && !spare.defined()) spare = at::empty({chunk}, input.options());
      at::Tensor receiving = s + 2 < n ? spare : out;
      std::vector<at::Tensor> to_send{sending}, to_receive{receiving};
      const int tag = kRingTagBit | static_cast<int>((tag_base + s) % kRingTagBit);
      auto sent = backend->send(to_send, static_cast<int>(next), tag);
      auto received = backend->recv(to_receive, static_cast<int>(prev), tag);
      wait_backend(sent);
      wait_backend(received);
      receiving.add_(in[recv_chunk]);
      sending = receiving;
    }
  }
};

}  // namespace tessera::comm
