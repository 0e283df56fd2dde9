// comm::Group's operations (group.h): the collectives, point-to-point sends and receives (Gloo on
// the caller's thread, NCCL coalesced on the communication thread) and the barrier, each counted
// and named in the flight record; the stream discipline of CUDA (NCCL) groups is in group_impl.h.
#include "comm/group.h"

#include <ATen/MemoryOverlap.h>

#include "comm/group_impl.h"

namespace tessera::comm {

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
  require(at::get_overlap_status(output, input) == at::MemOverlapStatus::No,
          "internal: reduce_scatter on group '", g.name, "': the output overlaps the input");
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
  double bytes = 0, inter_node = 0;
  for (int64_t j = 0; j < g.size(); ++j) {
    if (j == g.rank) continue;
    const double sent = static_cast<double>(input_rows[static_cast<size_t>(j)] * per_row * input.element_size());
    bytes += sent;
    if (!g.node_of_member.empty() && g.node_of_member[static_cast<size_t>(j)] != g.node_of_member[static_cast<size_t>(g.rank)])
      inter_node += sent;
  }
  for (int64_t& r : input_rows) r *= per_row;  // c10d's splits count elements of the flat tensors
  for (int64_t& r : output_rows) r *= per_row;
  return g.enqueue("all_to_all of " + shape_text(input),
                   [&g, output, input, output_rows = std::move(output_rows), input_rows = std::move(input_rows),
                    bytes, inter_node]() mutable {
                     const at::Tensor flat_output = output.view({-1});
                     at::Tensor out = g.staged(flat_output), in = g.staged(input.view({-1}));
                     at::Tensor out_wire = g.on_wire(out), in_wire = g.on_wire(in);
                     g.wait_backend(g.backend->alltoall_base(out_wire, in_wire, output_rows, input_rows));
                     Impl::unstage(flat_output, out);
                     g.count("all_to_all", bytes, inter_node);
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

}  // namespace tessera::comm
