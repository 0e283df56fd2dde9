// OffloadedShard: host buffers of ZeRO-Offload and the copies between them and the device
// (offload.h).
#include "memory/offload/offload.h"

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/GradMode.h>
#include <c10/core/Stream.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include "core/error.h"

namespace tessera {

// A stream of the device's pool used for copies only, and its two events (offload.h).
struct OffloadedShard::CopyStream {
  explicit CopyStream(at::Device device)
      : device(device),
        guard(device.type()),
        stream(guard.getStreamFromGlobalPool(device)),
        ready(device.type()),
        copied(device.type()) {}

  at::Device device;
  c10::impl::VirtualGuardImpl guard;
  c10::Stream stream;
  c10::Event ready;   // recorded on the compute stream before each batch of copies
  c10::Event copied;  // recorded on the copy stream after each batch of copies
};

OffloadedShard::OffloadedShard(const std::vector<FlatUnit>& units, at::Device device) : sources_(units.size()) {
  if (device.is_cuda()) stream_ = std::make_unique<CopyStream>(device);
  const auto options = at::TensorOptions().dtype(at::kFloat).device(at::kCPU).pinned_memory(device.is_cuda());
  at::NoGradGuard no_grad;
  for (const auto& unit : units) {
    masters_.push_back(at::empty({unit.shard_numel()}, options));
    grads_.push_back(at::zeros({unit.shard_numel()}, options));
  }
  masters_from_device(units);
}

OffloadedShard::~OffloadedShard() {
  if (stream_) stream_->copied.synchronize();
}

void OffloadedShard::add_grad_source(size_t group, at::Tensor device, at::Tensor host) {
  require(device.numel() == host.numel() && !host.is_cuda(), "internal: offload gradient source of ",
          device.numel(), " elements for a host slice of ", host.numel());
  if (group >= sources_.size()) sources_.resize(group + 1);
  sources_[group].emplace_back(device.reshape(-1), std::move(host));
}

template <class Copies>
void OffloadedShard::on_copy_stream(const Copies& copies) {
  at::NoGradGuard no_grad;
  if (!stream_) return copies(/*non_blocking=*/false);
  CopyStream& s = *stream_;
  s.ready.record(s.guard.getStream(s.device));
  s.ready.block(s.stream);
  {
    c10::StreamGuard on_copy(s.stream);
    copies(/*non_blocking=*/true);
  }
  s.copied.record(s.stream);
}

void OffloadedShard::grads_to_host(size_t group) {
  on_copy_stream([&](bool non_blocking) {
    for (auto& [device, host] : sources_.at(group)) host.copy_(device, non_blocking);
  });
}

void OffloadedShard::wait() {
  if (stream_) stream_->copied.synchronize();
}

void OffloadedShard::masters_to_device(const std::vector<FlatUnit>& units) {
  on_copy_stream([&](bool non_blocking) {
    for (size_t u = 0; u < units.size(); ++u) units[u].shard().copy_(masters_[u], non_blocking);
  });
  if (stream_) stream_->copied.block(stream_->guard.getStream(stream_->device));
}

void OffloadedShard::masters_from_device(const std::vector<FlatUnit>& units) {
  at::NoGradGuard no_grad;
  for (size_t u = 0; u < units.size(); ++u) masters_[u].copy_(units[u].shard());
}

int64_t OffloadedShard::bytes() const {
  int64_t total = 0;
  for (size_t u = 0; u < masters_.size(); ++u)
    total += static_cast<int64_t>(masters_[u].nbytes() + grads_[u].nbytes());
  return total;
}

}  // namespace tessera
