// OffloadedShard: the host side of ZeRO-Offload (Ren et al., "ZeRO-Offload", 2021). This rank's
// shard of every ZeRO unit (flat_unit.h) has a float32 master copy and a gradient buffer on the
// host; the optimizer's leaves are views of the master copies, with views of the gradient buffers
// as their .grad, so the optimizer state and the update live on the host too.
//
// Per unit u, S = units[u].shard_numel() (the shard's layout, padding included):
//   master(u)  [S] float32, host   the values the optimizer updates
//   grad(u)    [S] float32, host   the shard's gradient (the dp mean), filled from the device
// On a CUDA device both are pinned, so the copies can be asynchronous; on a CPU device they are
// separate host tensors all the same (the copies are then plain synchronous copies).
//
// Copies. On CUDA every copy runs on the copy stream, a pool stream of its own (c10::Stream and
// c10::Event: the device-generic face of CUDA streams and events, which also compiles in a build
// without CUDA). Each batch of copies first makes the copy stream wait for the work queued so far
// on the current (compute) stream (event `ready`), then copies with non_blocking and records
// `copied` on the copy stream:
//   grads_to_host(g)     device gradient slices -> grad(u)      the host waits in wait()
//   masters_to_device()  master(u) -> the device shards         the compute stream waits on `copied`
//
// Invariants:
// - The device tensors given to add_grad_source() and the unit shards live at least as long as
//   this object (DataParallel's buckets, gradient shards and units), so no copy ever reads or
//   writes freed memory; the destructor waits for the copy stream.
// - The padding of master(u) and grad(u) stays zero: the optimizer never sees it and no gradient
//   source covers it.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "memory/residency/flat_unit.h"

namespace tessera {

class OffloadedShard {
 public:
  // Host buffers for every unit; the masters start as copies of the units' shards.
  OffloadedShard(const std::vector<FlatUnit>& units, at::Device device);
  ~OffloadedShard();
  OffloadedShard(const OffloadedShard&) = delete;
  OffloadedShard& operator=(const OffloadedShard&) = delete;

  const at::Tensor& master(size_t unit) const { return masters_[unit]; }
  const at::Tensor& grad(size_t unit) const { return grads_[unit]; }
  const std::vector<at::Tensor>& grads() const { return grads_; }

  // Makes the device tensor `device` the source of `host` (a slice of some grad(u), same numel)
  // in copy group `group` (a gradient bucket at stage 1, a unit at stages 2-3).
  void add_grad_source(size_t group, at::Tensor device, at::Tensor host);
  // Launches the copies of one group's sources into the host gradients.
  void grads_to_host(size_t group);
  // Blocks the host until every copy launched so far has finished.
  void wait();
  // Copies every master into its unit's shard; work queued on the compute stream afterwards
  // (the parameter all-gather, a forward) sees the copied values.
  void masters_to_device(const std::vector<FlatUnit>& units);
  // Sets every master to its unit's shard, synchronously (the device values were overwritten,
  // e.g. by a checkpoint import).
  void masters_from_device(const std::vector<FlatUnit>& units);

  // Host bytes of the masters and gradient buffers.
  int64_t bytes() const;

 private:
  struct CopyStream;  // the CUDA copy stream and its events; null on a CPU device

  // Runs `copies` on the copy stream after the compute stream's queued work (CUDA), or right away.
  template <class Copies>
  void on_copy_stream(const Copies& copies);

  std::vector<at::Tensor> masters_, grads_;
  std::vector<std::vector<std::pair<at::Tensor, at::Tensor>>> sources_;  // per group: (device, host)
  std::unique_ptr<CopyStream> stream_;
};

}  // namespace tessera
