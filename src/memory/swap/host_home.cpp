// HostHome: the swap engine's home in host memory (host_home.h).
#include "memory/swap/host_home.h"

#include "core/error.h"

namespace tessera::swap {

HostHome::HostHome(size_t units) : materialized_(units, false) {}

HostHome::~HostHome() = default;

void HostHome::stop() { drain(); }

std::function<void()> HostHome::traced(std::function<void()> job, std::vector<comm::Work> after) {
  std::function<void(double, double)> trace = std::move(trace_);
  trace_ = nullptr;
  return [job = std::move(job), after = std::move(after), trace = std::move(trace), clock = clock_]() mutable {
    for (comm::Work& w : after) w.wait();
    const double start = clock ? clock() : 0;
    job();
    if (trace) trace(start, clock ? clock() : 0);
  };
}

comm::Work HostHome::fetch(size_t unit, std::vector<comm::Work> after) {
  materialized_[unit] = true;
  return comm::Work(load_.submit(traced(load_job(unit), std::move(after))));
}

comm::Work HostHome::release(size_t unit, std::vector<comm::Work> after) {
  materialized_[unit] = false;
  bool ready = true;
  for (const comm::Work& w : after) ready = ready && w.ready();
  std::function<void()> job = traced([this, unit] { evict(unit); }, std::move(after));
  if (!ready) return comm::Work(store_.submit(std::move(job)));
  job();  // rethrows what the Works it waited for threw
  return {};
}

comm::Work HostHome::store(size_t unit) {
  require(materialized_[unit], "internal: storing the gradients of swap unit ", unit, ", which is not loaded");
  return comm::Work(store_.submit(traced(store_job(unit), {})));
}

void HostHome::drain() {
  load_.drain();
  store_.drain();
}

}  // namespace tessera::swap
