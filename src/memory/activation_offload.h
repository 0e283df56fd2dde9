// Activation offload (memory.activation_offload; docs/memory.md): what autograd saves in a block's
// forward waits in host memory until the block's backward, instead of on the device.
//
// A block's SavedActivationScope (saved_activations.h) puts every activation it keeps (encoded
// by memory.activation_compression, or as it is) into one OffloadGroup. Weights and tensors off
// the gradient's path (a rotary table) stay where they are.
//
//   store   when the block's forward ends: one job on the store stream copies every encoding to
//           the host (pinned memory on CUDA, allocated when the store is issued) and then drops
//           the device copies. The store waits first for the one before it to end, so the
//           device never holds more than two groups of a forward: the one being stored and the
//           one the next block fills (the activation policy's reserve, plan/activation_policy.h).
//   fetch   ahead of the block's backward: one job on the load stream, after the store, copies
//           them back into device memory allocated when the fetch is issued (so on CUDA the
//           memory belongs to the compute stream). Issued once; later calls do nothing. When the
//           store has not ended yet (the last block, whose backward follows the head's at once),
//           the group is kept: the store job leaves the device copies where they are and the
//           group uses them, so the device never holds a block twice.
//   get     a saved tensor's unpack: waits for the fetch, issuing it first when nobody did (an
//           exposed fetch, counted). The host copy is freed at the first get after the fetch.
//
// The fetched copies live until the group's last saved tensor is released, so a backward that
// unpacks a tensor twice (the zero-bubble schedules' W after its I) finds it on the device.
//
// Prefetch (saved_activations.h links the groups): a hook on block b's output runs when the
// gradient reaching block b is ready, that is just before b's backward, and fetches b's group and
// the group of the block that made b's input; that block's copies then overlap b's backward. A
// pipeline stage's last block, whose gradient comes from the next stage, is fetched when the
// receive of that gradient is posted (parallel/pipeline_step.cpp), overlapping what the rank runs
// while it waits.
//
// Streams: copy_streams.h's Workers and CopyLinks, one each way. On CUDA the copies run on pool
// streams after an event recorded on the compute stream when issued; on the CPU "device" they are
// memory copies lasting at least bytes / modelled bandwidth, as the swap engine's.
//
// Counting (with count_saved_activations on): a group's bytes count as held on the device from
// pack until its store ends, as held on the host from then until the fetch ends, and on the
// device again from the fetch's issue until the group is freed (a kept group: on the device
// throughout).
//
// Invariants: add() only before store(); store() once, on the thread that ran the forward; no job
// uses its group (each holds what it copies); ~OffloadGroup waits for its jobs in flight, except a
// kept group's store, which moves and counts nothing once told to keep; the ActivationOffload
// outlives its groups (each group holds it) and drains its streams when it goes.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <c10/core/Device.h>

#include "memory/activation_codec.h"
#include "memory/copy_streams.h"

namespace tessera {

struct ActivationOffloadStats {
  int64_t groups = 0;           // groups stored
  int64_t stored_bytes = 0;     // bytes copied to the host
  int64_t exposed_fetches = 0;  // fetches issued by an unpack, not ahead of it
  double fetch_wait_s = 0;      // time unpacks waited for fetches (issued ahead or not)
  double store_wait_s = 0;      // time groups waited, when freed, for a store still running
  double store_ahead_wait_s = 0;  // time a store waited for the one before it to end (two groups at most)
  double store_s = 0, fetch_s = 0;  // time the store and load streams spent on copies
  int64_t copied_to_host = 0, copied_to_device = 0;  // bytes those copies moved
  int64_t kept_groups = 0;      // groups whose backward came before their store ended: kept
};
// Every ActivationOffload of the process, since the last reset.
ActivationOffloadStats activation_offload_stats();
void reset_activation_offload_stats();

// A timeline of the offload (bench): while tracing, every group records its block's forward (from
// the scope's start to its store), its store and fetch copies, the start of its backward (the hook
// on its output) and every wait of an unpack, on the steady clock, in seconds since its epoch.
struct OffloadEvent {
  std::string what;  // "forward", "store", "fetch", "backward", "wait"
  int64_t group = 0;  // groups numbered as made
  double start = 0, end = 0;
};
// Starts a new trace (clearing the last) or stops tracing.
void trace_activation_offload(bool on);
std::vector<OffloadEvent> activation_offload_trace();
double steady_seconds();

class ActivationOffload {
 public:
  // `modelled_bandwidth`: bytes per second each way on a CPU "device" (0: as fast as memcpy).
  ActivationOffload(c10::Device device, double modelled_bandwidth);
  ~ActivationOffload();  // runs the jobs still queued
  ActivationOffload(const ActivationOffload&) = delete;
  ActivationOffload& operator=(const ActivationOffload&) = delete;

 private:
  friend class OffloadGroup;
  c10::Device device_;
  std::mutex last_store_mutex_;
  Ticket last_store_;  // the last group's store job
  CopyLink store_link_, load_link_;
  Worker store_{"activation store"}, load_{"activation load"};
};

class OffloadGroup {
 public:
  explicit OffloadGroup(std::shared_ptr<ActivationOffload> offload);
  ~OffloadGroup();
  OffloadGroup(const OffloadGroup&) = delete;
  OffloadGroup& operator=(const OffloadGroup&) = delete;

  // An encoding to keep on the host (during the forward); `counted`: the bytes it counts.
  size_t add(EncodedTensor encoded, int64_t counted);
  bool empty() const { return entries_.empty(); }
  void store();
  void fetch();
  // Encoding `index` on the device.
  EncodedTensor get(size_t index);
  // The gradient reached the block's output (traced as the start of its backward).
  void backward_starts();

 private:
  void fetch_locked(std::unique_lock<std::mutex>& lock);
  // Drops the host copies once (whether this call did).
  bool free_host_copies();
  struct Transfer;
  std::shared_ptr<ActivationOffload> offload_;
  int64_t id_ = 0;
  double made_ = 0;  // when the block's forward began (steady_seconds)
  std::mutex mutex_;
  std::vector<EncodedTensor> entries_;  // until store(): on the device; after: the host copies
  std::vector<EncodedTensor> fetched_;  // after fetch(): the device copies being filled
  int64_t counted_ = 0;
  std::shared_ptr<Transfer> transfer_;  // shared with the store job
  bool stored_ = false, fetched_issued_ = false, host_freed_ = false, kept_ = false;
  Ticket store_ticket_, fetch_ticket_;
};

}  // namespace tessera
