// Saved activations in host memory between a block's forward and backward (activation_offload.h).
#include "memory/activation_offload.h"

#include <atomic>
#include <chrono>
#include <utility>

#include <ATen/ATen.h>

#include "memory/saved_activations.h"

namespace tessera {
namespace {

// An empty tensor like `t` at `where` (pinned when it is the host of a CUDA device).
at::Tensor empty_like_at(const at::Tensor& t, c10::Device where, bool pinned) {
  if (!t.defined()) return t;
  return at::empty(t.sizes(), t.options().device(where).pinned_memory(pinned));
}

EncodedTensor empty_encoding_at(const EncodedTensor& e, c10::Device where, bool pinned) {
  EncodedTensor out = e;
  out.data = empty_like_at(e.data, where, pinned);
  out.scales = empty_like_at(e.scales, where, pinned);
  return out;
}

// Copies every defined tensor of `from` into the matching one of `to`.
void copy_encodings(std::vector<EncodedTensor>& to, const std::vector<EncodedTensor>& from, bool non_blocking) {
  for (size_t i = 0; i < to.size(); ++i) {
    if (to[i].data.defined()) to[i].data.copy_(from[i].data, non_blocking);
    if (to[i].scales.defined()) to[i].scales.copy_(from[i].scales, non_blocking);
  }
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::mutex stats_mutex;
ActivationOffloadStats stats;
bool tracing = false;
std::vector<OffloadEvent> trace;
std::atomic<int64_t> next_group{0};

void traced(const char* what, int64_t group, double start, double end) {
  std::lock_guard<std::mutex> lock(stats_mutex);
  if (tracing) trace.push_back({what, group, start, end});
}

template <class F>
void update_stats(F&& change) {
  std::lock_guard<std::mutex> lock(stats_mutex);
  change(stats);
}

}  // namespace

ActivationOffloadStats activation_offload_stats() {
  std::lock_guard<std::mutex> lock(stats_mutex);
  return stats;
}

void reset_activation_offload_stats() {
  std::lock_guard<std::mutex> lock(stats_mutex);
  stats = {};
}

void trace_activation_offload(bool on) {
  std::lock_guard<std::mutex> lock(stats_mutex);
  tracing = on;
  if (on) trace.clear();
}

std::vector<OffloadEvent> activation_offload_trace() {
  std::lock_guard<std::mutex> lock(stats_mutex);
  return trace;
}

double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

ActivationOffload::ActivationOffload(c10::Device device, double modelled_bandwidth)
    : device_(device), store_link_(device, modelled_bandwidth), load_link_(device, modelled_bandwidth) {}

ActivationOffload::~ActivationOffload() {
  store_.drain();
  load_.drain();
}

OffloadGroup::OffloadGroup(std::shared_ptr<ActivationOffload> offload)
    : offload_(std::move(offload)), id_(next_group.fetch_add(1)), made_(steady_seconds()) {}

void OffloadGroup::backward_starts() {
  const double now = steady_seconds();
  traced("backward", id_, now, now);
}

// What the store job and its group share: the device copies until the store ends, or for good
// when a fetch came first (the backward reached the block before its store ended: the group then
// uses them as they are and moves nothing back).
struct OffloadGroup::Transfer {
  std::mutex mutex;
  std::vector<EncodedTensor> device;
  bool ended = false;  // the copy to the host ended
  bool keep = false;   // a fetch came before it ended
};

OffloadGroup::~OffloadGroup() {
  // The jobs hold what they copy; waiting keeps the counts exact (a group is freed before its
  // store ended only when a graph is dropped without its backward). A kept group's store job
  // counts nothing, so the backward does not wait for it to come up in the queue.
  const auto start = std::chrono::steady_clock::now();
  bool waited = false;
  if (store_ticket_.valid() && !kept_) {
    waited = store_ticket_.wait_for(std::chrono::seconds(0)) != std::future_status::ready;
    store_ticket_.wait();
  }
  if (fetch_ticket_.valid()) fetch_ticket_.wait();
  if (waited) update_stats([&](ActivationOffloadStats& s) { s.store_wait_s += seconds_since(start); });
  if (!counted_) return;
  if (!stored_ || kept_) count_saved_bytes(-counted_, 0);
  else if (fetched_issued_) count_saved_bytes(-counted_, host_freed_ ? 0 : -counted_);
  else count_saved_bytes(0, -counted_);
}

size_t OffloadGroup::add(EncodedTensor encoded, int64_t counted) {
  std::lock_guard<std::mutex> lock(mutex_);
  counted_ += counted;
  entries_.push_back(std::move(encoded));
  return entries_.size() - 1;
}

void OffloadGroup::store() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (stored_ || entries_.empty()) return;
  stored_ = true;
  traced("forward", id_, made_, steady_seconds());
  Ticket before;
  {
    std::lock_guard<std::mutex> last(offload_->last_store_mutex_);
    before = offload_->last_store_;
  }
  if (before.valid() && before.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
    const auto start = std::chrono::steady_clock::now();
    before.wait();
    update_stats([&](ActivationOffloadStats& s) { s.store_ahead_wait_s += seconds_since(start); });
  }
  const bool pinned = offload_->device_.is_cuda();
  transfer_ = std::make_shared<Transfer>();
  transfer_->device = std::move(entries_);
  entries_.clear();
  int64_t bytes = 0;
  for (const EncodedTensor& e : transfer_->device) {
    entries_.push_back(empty_encoding_at(e, c10::Device(at::kCPU), pinned));
    bytes += e.bytes();
  }
  update_stats([&](ActivationOffloadStats& s) {
    s.groups += 1;
    s.stored_bytes += bytes;
  });
  // The copy reads transfer->device, which nothing changes until the job below ends it.
  auto copy = offload_->store_link_.job(
      [transfer = transfer_, host = entries_](bool non_blocking) mutable {
        copy_encodings(host, transfer->device, non_blocking);
      },
      static_cast<double>(bytes));
  store_ticket_ = offload_->store_.submit([copy = std::move(copy), transfer = transfer_, counted = counted_, id = id_,
                                           bytes] {
    {
      std::lock_guard<std::mutex> lock(transfer->mutex);
      if (transfer->keep) {  // the backward came while this job waited its turn: nothing to move
        transfer->ended = true;
        return;
      }
    }
    const double start = steady_seconds();
    copy();  // complete when it returns (CUDA: its event synchronized)
    const double end = steady_seconds();
    update_stats([&](ActivationOffloadStats& s) {
      s.store_s += end - start;
      s.copied_to_host += bytes;
    });
    traced("store", id, start, end);
    std::lock_guard<std::mutex> lock(transfer->mutex);
    transfer->ended = true;
    if (transfer->keep) return;
    transfer->device.clear();  // the device copies go
    count_saved_bytes(-counted, counted);
  });
  std::lock_guard<std::mutex> last(offload_->last_store_mutex_);
  offload_->last_store_ = store_ticket_;
}

void OffloadGroup::fetch() {
  std::unique_lock<std::mutex> lock(mutex_);
  fetch_locked(lock);
}

void OffloadGroup::fetch_locked(std::unique_lock<std::mutex>&) {
  if (fetched_issued_ || !stored_) return;
  fetched_issued_ = true;
  {
    std::lock_guard<std::mutex> lock(transfer_->mutex);
    if (!transfer_->ended) {  // still on the device: keep it there
      transfer_->keep = kept_ = true;
      update_stats([](ActivationOffloadStats& s) { s.kept_groups += 1; });
      return;
    }
  }
  int64_t bytes = 0;
  for (const EncodedTensor& e : entries_) {
    fetched_.push_back(empty_encoding_at(e, offload_->device_, false));
    bytes += e.bytes();
  }
  count_saved_bytes(counted_, 0);
  Ticket stored = store_ticket_;
  store_ticket_ = {};  // the fetch job waits for it; ~OffloadGroup waits for the fetch
  auto copy = offload_->load_link_.job([host = entries_, device = fetched_](bool non_blocking) mutable {
    copy_encodings(device, host, non_blocking);
  }, static_cast<double>(bytes));
  fetch_ticket_ = offload_->load_.submit([stored, copy = std::move(copy), id = id_, bytes] {
    stored.get();  // rethrows the store's failure
    const double start = steady_seconds();
    copy();
    const double end = steady_seconds();
    update_stats([&](ActivationOffloadStats& s) {
      s.fetch_s += end - start;
      s.copied_to_device += bytes;
    });
    traced("fetch", id, start, end);
  });
}

bool OffloadGroup::free_host_copies() {
  if (host_freed_) return false;
  host_freed_ = true;
  for (EncodedTensor& e : entries_) e.data = e.scales = at::Tensor();
  return true;
}

EncodedTensor OffloadGroup::get(size_t index) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!stored_) return entries_.at(index);  // the block's forward has not ended (a recomputation)
  if (!fetched_issued_) {
    fetch_locked(lock);
    if (!kept_) update_stats([](ActivationOffloadStats& s) { s.exposed_fetches += 1; });
  }
  if (kept_) {
    // The store job only reads the kept copies, and never changes them once told to keep them.
    free_host_copies();  // never counted: a kept group's bytes stay on the device
    return transfer_->device.at(index);
  }
  Ticket ticket = fetch_ticket_;
  lock.unlock();
  const double start = steady_seconds();
  ticket.get();
  const double end = steady_seconds(), waited = end - start;
  if (waited > 1e-5) traced("wait", id_, start, end);
  lock.lock();
  update_stats([&](ActivationOffloadStats& s) { s.fetch_wait_s += waited; });
  if (free_host_copies() && counted_) count_saved_bytes(0, -counted_);
  return fetched_.at(index);
}

}  // namespace tessera
