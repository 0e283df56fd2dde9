// Copy streams between the host and the device, shared by the swap engine (memory/swap/) and
// activation offload (activation_offload.h). The compute stream is the calling thread (and, on
// CUDA, its current stream); every other stream is a Worker, a thread running its jobs one at a
// time in submission order, so a stream's actions keep their issue order.
// A job's future (Ticket) is ready when the job's effect is complete: a copy's data is at its
// destination (CUDA: the copy's event was synchronized before the job returns), an update is
// applied. Waiting on a Ticket rethrows the job's exception.
//
// CopyLink: copies between the host and the device, one per copy stream.
//   CUDA           a pool stream of its own; each batch of copies first waits for event `ready`,
//                  recorded on the compute stream when the batch was submitted (a store reads
//                  what the compute stream wrote), runs with non_blocking from pinned host memory
//                  and ends by synchronizing event `copied`.
//   CPU "device"   the same copies as plain memory copies; with a modelled bandwidth (bytes per
//                  second) a batch of `bytes` lasts at least bytes / bandwidth (the copy, then a
//                  sleep for the rest), so overlap and exposure behave as over a real link.
// One code path drives both: the callers submit the same jobs, only the link differs.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <c10/core/Device.h>

namespace tessera {

using Ticket = std::shared_future<void>;

class Worker {
 public:
  explicit Worker(std::string name);
  ~Worker();  // runs the jobs still queued, then joins
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  Ticket submit(std::function<void()> job);
  // Blocks until every job submitted so far has run (exceptions stay in their tickets).
  void drain();
  const std::string& name() const { return name_; }

 private:
  void loop();

  std::string name_;
  std::mutex mutex_;
  std::condition_variable wake_, idle_;
  std::deque<std::packaged_task<void()>> jobs_;
  bool running_ = false, stop_ = false;
  std::thread thread_;
};

class CopyLink {
 public:
  // `modelled_bandwidth`: bytes per second of the CPU "device"'s link (0: as fast as memcpy);
  // ignored on CUDA, whose link is real.
  CopyLink(c10::Device device, double modelled_bandwidth);
  ~CopyLink();
  CopyLink(const CopyLink&) = delete;
  CopyLink& operator=(const CopyLink&) = delete;

  // A job for a Worker that runs `copies(non_blocking)` of `bytes` on this link after the work
  // queued on the compute stream at this call (CUDA: event `ready` recorded now).
  std::function<void()> job(std::function<void(bool non_blocking)> copies, double bytes);

 private:
  struct Cuda;  // the pool stream; null on a CPU device
  c10::Device device_;
  double bandwidth_;
  std::unique_ptr<Cuda> cuda_;
};

}  // namespace tessera
