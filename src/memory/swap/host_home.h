// HostHome: the swap engine's home (memory/residency/home.h): every unit's values live in host
// memory, and the device holds a unit between a fetch (its LOAD) and a release (its EVICT). The
// residency layer (memory/residency/residency.h) drives it like ZeRO-3's sharded home; the swap
// executor (swap_executor.h) is its driver. Its two copy streams are Workers (memory/copy_streams.h):
//
//   load    fetch: the unit's load job (host -> device), after the Works it is given (the unit's
//           release still in flight, its update still running on the host)
//   store   store: the unit's gradients to the host; a release whose Works have not all finished
//           (a store in flight) follows them on this stream, any other runs at once on the
//           calling thread
//
// The jobs are the subclass's (SwapOwner: memory/swap/swap_owner.h), made on the calling thread
// when the movement is issued, so a copy's CUDA event `ready` follows the compute queued before it.
// trace_next(fn): the next movement issued reports when it ran (fn(start, end) from its stream,
// in the caller's clock), for the measured timeline.
//
// Invariants: materialized(u) is the caller's view (home.h); jobs for one unit run in the order
// the residency layer issues them (its Works order them across the two streams); drain() waits
// for both streams, after which no job runs.
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include "memory/residency/home.h"
#include "memory/copy_streams.h"

namespace tessera::swap {

class HostHome : public Home {
 public:
  explicit HostHome(size_t units);
  ~HostHome() override;

  size_t units() const override { return materialized_.size(); }
  bool materialized(size_t unit) const override { return materialized_[unit]; }
  comm::Work fetch(size_t unit, std::vector<comm::Work> after) override;
  comm::Work release(size_t unit, std::vector<comm::Work> after) override;
  // The unit's gradients, device -> host, on the store stream.
  comm::Work store(size_t unit);

  void trace_next(std::function<void(double start, double end)> trace) { trace_ = std::move(trace); }
  void set_clock(std::function<double()> clock) { clock_ = std::move(clock); }
  // Waits until both streams ran every job issued so far.
  void drain();

 protected:
  virtual std::function<void()> load_job(size_t unit) = 0;
  virtual std::function<void()> store_job(size_t unit) = 0;
  virtual void evict(size_t unit) = 0;
  // Subclasses stop both streams in their destructor (their jobs use their members).
  void stop();

 private:
  // `job`, after `after`, reporting to the pending trace.
  std::function<void()> traced(std::function<void()> job, std::vector<comm::Work> after);
  std::vector<bool> materialized_;
  std::function<void(double, double)> trace_;
  std::function<double()> clock_;
  Worker load_{"swap load"}, store_{"swap store"};
};

}  // namespace tessera::swap
