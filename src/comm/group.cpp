// comm::Group (group.h): the per-group communication thread, the Gloo ring reduce-scatter, and
// the stream discipline of CUDA (NCCL) groups.
#include "comm/group.h"

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
#include "core/error.h"
#include "core/fault_injection.h"

namespace tessera::comm {

// Tags of the ring collectives have this bit set; tags callers pass to send/recv must stay below it.
constexpr int kRingTagBit = 1 << 30;

namespace {
std::string shape_text(const at::Tensor& t) {
  return std::to_string(t.numel() * static_cast<int64_t>(t.element_size())) + " bytes";
}
}  // namespace

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

  std::mutex mutex;
  std::condition_variable ready;
  std::deque<std::function<void()>> queue;
  bool stopping = false;
  std::atomic<bool> failed{false};
  std::thread thread;

  std::mutex traffic_mutex;
  std::map<std::string, int64_t> traffic;
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

  void count(const std::string& op, double bytes) {
    std::lock_guard<std::mutex> lock(traffic_mutex);
    traffic[op] += static_cast<int64_t>(bytes);
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
  // chunk (r - s - 1) mod N to r + 1 and adds the partial of chunk (r - s - 2) mod N received
  // from r - 1. After the last step chunk r holds the sum over all ranks.
  void ring_reduce_scatter(at::Tensor output, at::Tensor input) {
    const int64_t n = size();
    const int64_t chunk = output.numel();
    at::Tensor acc = input.reshape({n, chunk}).clone();
    at::Tensor incoming = at::empty({chunk}, input.options());
    const int64_t next = (rank + 1) % n, prev = (rank + n - 1) % n;
    const int64_t tag_base = ring_tag++ * n;
    for (int64_t s = 0; s + 1 < n; ++s) {
      const int64_t send_chunk = ((rank - s - 1) % n + n) % n, recv_chunk = ((rank - s - 2) % n + n) % n;
      std::vector<at::Tensor> out{acc[send_chunk]}, in{incoming};
      const int tag = kRingTagBit | static_cast<int>((tag_base + s) % kRingTagBit);
      auto sent = backend->send(out, static_cast<int>(next), tag);
      auto received = backend->recv(in, static_cast<int>(prev), tag);
      wait_backend(sent);
      wait_backend(received);
      acc[recv_chunk].add_(incoming);
    }
    output.copy_(acc[rank].view_as(output));
  }
};

void Work::wait() {
  if (done_.valid()) done_.get();
}

Group::Group(std::string name, std::vector<int64_t> ranks, int64_t rank, c10::intrusive_ptr<c10d::Backend> backend,
             std::chrono::milliseconds timeout, c10::Device device)
    : impl_(std::make_shared<Impl>()) {
  require(!ranks.empty() && rank >= 0 && rank < static_cast<int64_t>(ranks.size()),
          "internal: group '", name, "' rank ", rank, " outside its ", ranks.size(), " members");
  require(backend || ranks.size() == 1, "internal: group '", name, "' of ", ranks.size(), " ranks has no backend");
  require(device.is_cpu() || (device.is_cuda() && device.has_index()), "internal: group '", name, "' on device ",
          device, " (cpu or an indexed cuda device expected)");
  impl_->name = std::move(name);
  impl_->ranks = std::move(ranks);
  impl_->rank = rank;
  impl_->backend = std::move(backend);
  impl_->timeout = timeout;
  impl_->device = device;
  flight_group(impl_->name, impl_->ranks);
  impl_->thread = std::thread([impl = impl_] { impl->run_queue(); });
}

Group::~Group() {
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->stopping = true;
  }
  impl_->ready.notify_one();
  // After a failure the thread may be blocked in the backend until its timeout: leave it.
  if (impl_->failed) {
    impl_->thread.detach();
    return;
  }
  impl_->thread.join();
  // NCCL's normal exit (what destroy_process_group does in Python): finish and free the
  // communicator now, while every member is also tearing its mesh down.
  if (impl_->backend && impl_->on_cuda()) impl_->backend->shutdown();
}

const std::string& Group::name() const { return impl_->name; }
int64_t Group::rank() const { return impl_->rank; }
int64_t Group::size() const { return impl_->size(); }
int64_t Group::global_rank() const { return impl_->ranks[impl_->rank]; }
int64_t Group::global_rank_of(int64_t rank) const { return impl_->ranks.at(rank); }
const std::vector<int64_t>& Group::ranks() const { return impl_->ranks; }
c10::Device Group::device() const { return impl_->device; }

namespace {

c10d::ReduceOp backend_op(ReduceOp op) {
  return op == ReduceOp::max ? c10d::ReduceOp(c10d::ReduceOp::MAX) : c10d::ReduceOp(c10d::ReduceOp::SUM);
}

// A Gloo send or receive posted to the backend, with the tensor it reads or writes. Gloo's
// transport thread completes the operation into its Work's buffer and the tensor, so neither may
// be freed before a wait saw it finish. A step that fails (a peer died, a timeout) unwinds with
// operations posted and not waited; the last owner of such an operation hands it to a list kept
// for the rest of the process, which is about to report the failure. Waited operations are freed
// as usual: the list holds the abandoned ones only. (TSan found the transport thread signalling
// an abandoned send's buffer as the unwinding main thread destroyed it.)
class PostedOp {
 public:
  PostedOp(c10::intrusive_ptr<c10d::Work> work, at::Tensor tensor) : work_(std::move(work)), tensor_(std::move(tensor)) {}
  PostedOp(PostedOp&&) = default;
  PostedOp& operator=(PostedOp&&) = delete;
  PostedOp(const PostedOp&) = delete;
  ~PostedOp() {
    if (!work_) return;
    static std::mutex mutex;
    static auto* abandoned = new std::vector<std::pair<c10::intrusive_ptr<c10d::Work>, at::Tensor>>();
    std::lock_guard<std::mutex> lock(mutex);
    abandoned->emplace_back(std::move(work_), std::move(tensor_));
  }
  const c10::intrusive_ptr<c10d::Work>& work() const { return work_; }
  void finished() {  // a wait saw it finish: freed with this owner
    work_.reset();
    tensor_.reset();
  }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  at::Tensor tensor_;
};

}  // namespace

Work Group::all_reduce_async(at::Tensor tensor, ReduceOp op) {
  Impl& g = *impl_;
  require(tensor.is_contiguous(), "internal: all_reduce on group '", g.name, "' needs a contiguous tensor");
  if (g.size() == 1) return Work();
  const double bytes = 2.0 * (g.size() - 1) / g.size() * tensor.numel() * tensor.element_size();
  return g.enqueue("all_reduce of " + shape_text(tensor), [&g, tensor, op, bytes]() {
    const at::Tensor t = g.staged(tensor);
    std::vector<at::Tensor> tensors{t};
    c10d::AllreduceOptions options;
    options.reduceOp = backend_op(op);
    g.wait_backend(g.backend->allreduce(tensors, options));
    if (op == ReduceOp::avg) t.div_(static_cast<double>(g.size()));
    Impl::unstage(tensor, t);
    g.count("all_reduce", bytes);
  });
}

void Group::all_reduce(std::vector<at::Tensor> tensors, ReduceOp op) {
  std::map<at::ScalarType, std::vector<at::Tensor>> by_dtype;
  for (auto& t : tensors) by_dtype[t.scalar_type()].push_back(t);
  for (auto& [dtype, group] : by_dtype) {
    std::vector<at::Tensor> flat_parts;
    for (auto& t : group) flat_parts.push_back(t.reshape({-1}));
    at::Tensor flat = at::cat(flat_parts);
    all_reduce_async(flat, op).wait();
    int64_t offset = 0;
    for (auto& t : group) {
      t.copy_(flat.narrow(0, offset, t.numel()).view_as(t));
      offset += t.numel();
    }
  }
}

void Group::broadcast(at::Tensor tensor, int64_t root) {
  Impl& g = *impl_;
  if (g.size() == 1) return;
  const double bytes = g.rank == root ? static_cast<double>(tensor.numel() * tensor.element_size()) : 0.0;
  g.enqueue("broadcast of " + shape_text(tensor) + " from rank " + std::to_string(root), [&g, tensor, root, bytes]() {
     const at::Tensor t = g.staged(tensor);
     std::vector<at::Tensor> tensors{t};
     c10d::BroadcastOptions options;
     options.rootRank = root;
     g.wait_backend(g.backend->broadcast(tensors, options));
     Impl::unstage(tensor, t);
     g.count("broadcast", bytes);
   }).wait();
}

Work Group::all_gather_async(at::Tensor output, at::Tensor input) {
  Impl& g = *impl_;
  require(output.numel() == input.numel() * g.size() && output.is_contiguous() && input.is_contiguous(),
          "internal: all_gather on group '", g.name, "': output of ", output.numel(), " elements for ", g.size(),
          " inputs of ", input.numel());
  if (g.size() == 1) {
    output.view_as(input).copy_(input);
    return Work();
  }
  const double bytes = static_cast<double>(g.size() - 1) * input.numel() * input.element_size();
  return g.enqueue("all_gather of " + shape_text(output), [&g, output, input, bytes]() {
    at::Tensor out = g.staged(output), in = g.staged(input);
    g.wait_backend(g.backend->_allgather_base(out, in));
    Impl::unstage(output, out);
    g.count("all_gather", bytes);
  });
}

Work Group::reduce_scatter_async(at::Tensor output, at::Tensor input, ReduceOp op) {
  Impl& g = *impl_;
  require(input.numel() == output.numel() * g.size() && output.is_contiguous() && input.is_contiguous(),
          "internal: reduce_scatter on group '", g.name, "': input of ", input.numel(), " elements for ", g.size(),
          " outputs of ", output.numel());
  require(op != ReduceOp::max, "internal: reduce_scatter supports sum and avg");
  if (g.size() == 1) {
    output.copy_(input.view_as(output));
    return Work();
  }
  const double bytes = static_cast<double>(g.size() - 1) * output.numel() * output.element_size();
  return g.enqueue("reduce_scatter of " + shape_text(input), [&g, output, input, op, bytes]() {
    at::Tensor out = g.staged(output), in = g.staged(input);
    if (g.on_cuda()) {
      c10d::ReduceScatterOptions options;
      g.wait_backend(g.backend->_reduce_scatter_base(out, in, options));
    } else {
      g.ring_reduce_scatter(out, in);
    }
    if (op == ReduceOp::avg) out.div_(static_cast<double>(g.size()));
    Impl::unstage(output, out);
    g.count("reduce_scatter", bytes);
  });
}

Work Group::all_to_all_async(at::Tensor output, at::Tensor input) {
  Impl& g = *impl_;
  require(output.numel() == input.numel() && input.numel() % g.size() == 0 && output.is_contiguous() &&
              input.is_contiguous() && output.scalar_type() == input.scalar_type(),
          "internal: all_to_all on group '", g.name, "': input of ", input.numel(), " and output of ", output.numel(),
          " elements (contiguous, one dtype, a multiple of ", g.size(), " needed)");
  // size() equal chunks: one row per member.
  const std::vector<int64_t> one_each(static_cast<size_t>(g.size()), 1);
  return all_to_all_async(output.view({g.size(), -1}), input.view({g.size(), -1}), one_each, one_each);
}

Work Group::all_to_all_async(at::Tensor output, at::Tensor input, std::vector<int64_t> output_rows,
                             std::vector<int64_t> input_rows) {
  Impl& g = *impl_;
  const auto sum = [](const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), int64_t{0}); };
  require(static_cast<int64_t>(output_rows.size()) == g.size() && static_cast<int64_t>(input_rows.size()) == g.size() &&
              input.dim() > 0 && output.dim() > 0 && sum(input_rows) == input.size(0) &&
              sum(output_rows) == output.size(0) && input.sizes().slice(1) == output.sizes().slice(1) &&
              output.is_contiguous() && input.is_contiguous() && output.scalar_type() == input.scalar_type(),
          "internal: all_to_all on group '", g.name, "': input ", input.sizes(), " in rows ",
          at::IntArrayRef(input_rows), ", output ", output.sizes(), " in rows ", at::IntArrayRef(output_rows),
          " (one row count per member, summing to dim 0; other dims equal; contiguous, one dtype)");
  if (g.size() == 1) {
    output.copy_(input);
    return Work();
  }
  const int64_t per_row = c10::multiply_integers(input.sizes().slice(1));
  double bytes = 0;
  for (int64_t j = 0; j < g.size(); ++j)
    if (j != g.rank) bytes += static_cast<double>(input_rows[static_cast<size_t>(j)] * per_row * input.element_size());
  for (int64_t& r : input_rows) r *= per_row;  // c10d's splits count elements of the flat tensors
  for (int64_t& r : output_rows) r *= per_row;
  return g.enqueue("all_to_all of " + shape_text(input),
                   [&g, output, input, output_rows = std::move(output_rows), input_rows = std::move(input_rows),
                    bytes]() mutable {
                     const at::Tensor flat_output = output.view({-1});
                     at::Tensor out = g.staged(flat_output), in = g.staged(input.view({-1}));
                     at::Tensor out_wire = g.on_wire(out), in_wire = g.on_wire(in);
                     g.wait_backend(g.backend->alltoall_base(out_wire, in_wire, output_rows, input_rows));
                     Impl::unstage(flat_output, out);
                     g.count("all_to_all", bytes);
                   });
}

void Group::send_recv(at::Tensor send, int64_t to, at::Tensor recv, int64_t from, int64_t tag) {
  if (impl_->size() == 1) {
    recv.copy_(send);
    return;
  }
  impl_->point_to_point(send, to, recv, from, tag);
}

void Group::send(at::Tensor tensor, int64_t to, int64_t tag) { impl_->point_to_point(tensor, to, {}, -1, tag); }

void Group::recv(at::Tensor tensor, int64_t from, int64_t tag) { impl_->point_to_point({}, -1, tensor, from, tag); }

Work Group::send_async(at::Tensor tensor, int64_t to, int64_t tag) {
  Impl& g = *impl_;
  require(tag >= 0 && tag < kRingTagBit, "internal: send tag ", tag, " outside [0, 2^30)");
  require(g.size() > 1, "group '", g.name, "' has one member: there is no peer to send to");
  const std::string op = "send of " + shape_text(tensor) + " to rank " + std::to_string(to);
  if (g.on_cuda()) return g.enqueue(op, [&g, tensor, to]() { g.point_to_point(tensor, to, {}, -1, 0); });
  c10::intrusive_ptr<c10d::Work> sent;
  g.guarded(op, [&] {
    std::vector<at::Tensor> out{tensor};
    sent = g.backend->send(out, static_cast<int>(to), static_cast<int>(tag));
  });
  g.count("send", static_cast<double>(tensor.numel() * tensor.element_size()));
  std::shared_ptr<Impl> impl = impl_;  // the Work may outlive this call, not the group's state
  return Work(std::async(std::launch::deferred, [impl, posted = PostedOp(sent, tensor), op]() mutable {
                impl->guarded(op, [&] { impl->wait_backend(posted.work()); });
                posted.finished();
              }).share());
}

Work Group::recv_async(at::Tensor tensor, int64_t from, int64_t tag) {
  Impl& g = *impl_;
  std::shared_ptr<Impl> impl = impl_;
  if (g.on_cuda())
    return Work(std::async(std::launch::deferred, [impl, tensor, from, tag]() {
                  impl->point_to_point({}, -1, tensor, from, tag);
                }).share());
  require(tag >= 0 && tag < kRingTagBit, "internal: recv tag ", tag, " outside [0, 2^30)");
  require(g.size() > 1, "group '", g.name, "' has one member: there is no peer to receive from");
  const std::string op = "recv of " + shape_text(tensor) + " from rank " + std::to_string(from);
  c10::intrusive_ptr<c10d::Work> received;
  g.guarded(op, [&] {
    std::vector<at::Tensor> in{tensor};
    received = g.backend->recv(in, static_cast<int>(from), static_cast<int>(tag));
  });
  return Work(std::async(std::launch::deferred, [impl, posted = PostedOp(received, tensor), op]() mutable {
                impl->guarded(op, [&] { impl->wait_backend(posted.work()); });
                posted.finished();
              }).share());
}

Work Group::run_async(const std::string& op, std::function<void()> body) {
  return impl_->enqueue(op, std::move(body));
}

void Group::barrier() {
  Impl& g = *impl_;
  if (g.size() == 1) return;
  g.enqueue("barrier", [&g]() {
     c10d::BarrierOptions options;  // NCCL: a one-element all-reduce on this group's GPU
     if (g.on_cuda()) {
       options.device_ids = {g.device.index()};
       options.device = g.device;
     }
     g.wait_backend(g.backend->barrier(options));
   }).wait();
}

std::map<std::string, int64_t> Group::traffic() const {
  std::lock_guard<std::mutex> lock(impl_->traffic_mutex);
  return impl_->traffic;
}

int64_t Group::bytes_sent() const {
  int64_t total = 0;
  for (const auto& [op, bytes] : traffic()) total += bytes;
  return total;
}

double Group::busy_seconds() const {
  std::lock_guard<std::mutex> lock(impl_->traffic_mutex);
  return impl_->busy_seconds;
}

void Group::set_failure_diagnosis(std::function<std::string()> diagnose) { impl_->diagnose = std::move(diagnose); }

void Group::reset_traffic() {
  std::lock_guard<std::mutex> lock(impl_->traffic_mutex);
  impl_->traffic.clear();
  impl_->busy_seconds = 0;
}

}  // namespace tessera::comm
