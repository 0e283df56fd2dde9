// Workers and copy links of the swap engine (memory/copy_streams.h).
#include "memory/copy_streams.h"

#include <chrono>

#include <c10/core/Event.h>
#include <c10/core/GradMode.h>
#include <c10/core/Stream.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

namespace tessera {

Worker::Worker(std::string name) : name_(std::move(name)), thread_([this] { loop(); }) {}

Worker::~Worker() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

Ticket Worker::submit(std::function<void()> job) {
  std::packaged_task<void()> task(std::move(job));
  Ticket ticket = task.get_future().share();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    jobs_.push_back(std::move(task));
  }
  wake_.notify_one();
  return ticket;
}

void Worker::drain() {
  std::unique_lock<std::mutex> lock(mutex_);
  idle_.wait(lock, [&] { return jobs_.empty() && !running_; });
}

void Worker::loop() {
  for (;;) {
    std::packaged_task<void()> task;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stopping, nothing left
      task = std::move(jobs_.front());
      jobs_.pop_front();
      running_ = true;
    }
    task();  // an exception lands in the task's future
    {
      std::lock_guard<std::mutex> lock(mutex_);
      running_ = false;
    }
    idle_.notify_all();
  }
}

struct CopyLink::Cuda {
  explicit Cuda(c10::Device device)
      : device(device), guard(device.type()), stream(guard.getStreamFromGlobalPool(device)) {}
  c10::Device device;
  c10::impl::VirtualGuardImpl guard;
  c10::Stream stream;
};

CopyLink::CopyLink(c10::Device device, double modelled_bandwidth) : device_(device), bandwidth_(modelled_bandwidth) {
  if (device.is_cuda()) cuda_ = std::make_unique<Cuda>(device);
}

CopyLink::~CopyLink() = default;

std::function<void()> CopyLink::job(std::function<void(bool non_blocking)> copies, double bytes) {
  if (cuda_) {
    auto ready = std::make_shared<c10::Event>(device_.type());
    ready->record(cuda_->guard.getStream(device_));  // the compute stream's work so far
    return [this, ready, copies = std::move(copies)] {
      c10::NoGradGuard no_grad;
      ready->block(cuda_->stream);
      c10::Event copied(device_.type());
      {
        c10::StreamGuard on_link(cuda_->stream);
        copies(/*non_blocking=*/true);
      }
      copied.record(cuda_->stream);
      copied.synchronize();
    };
  }
  return [this, bytes, copies = std::move(copies)] {
    c10::NoGradGuard no_grad;
    const auto start = std::chrono::steady_clock::now();
    copies(/*non_blocking=*/false);
    if (bandwidth_ > 0)
      std::this_thread::sleep_until(start + std::chrono::duration<double>(bytes / bandwidth_));
  };
}

}  // namespace tessera
