// The one executor of swap plans (swap_plan.h): runs a plan's actions in issue order, each on its
// stream, and records when each ran (the measured timeline, drawn by swap_timeline.h). The copies
// go through the residency layer (memory/residency/residency.h) over the model's home in host
// memory (host_home.h), which orders them on its streams:
//
//   compute  COMPUTE_F/B on the calling thread (work.compute), after completing the fetches of
//            the sub-model and the ends, and a backward also after their STORE_GRAD still in
//            flight (the gradients it would add to must be gone)
//   load     LOAD fetches the sub-model (the home's load stream), issued with the COMPUTE before
//            it (the compute holds the calling thread until done, and the plan's LOAD overlaps
//            it); the layer makes it wait for the sub-model's EVICT when that ran on the store
//            stream, and for its OPTIM of the previous step when that is still running (its
//            update is a write of the home)
//   store    STORE_GRAD stores the sub-model's gradients (the home's store stream), a read of its
//            device storage; EVICT releases it: after that store on the store stream when it is
//            in flight, at once on the calling thread otherwise
//   host     OPTIM jobs on the host Worker, each after its sub-model's last STORE_GRAD; in a plan
//            with defer_optim, work.gradients_stored runs there first, once, after every store
//            (the norm and clipping); otherwise it runs on the calling thread after the plan
// run() returns once everything but the OPTIMs has finished (and, deferred, the norm): the
// updates run on into the next step, whose LOADs wait for them, so they overlap its forward.
// settle() waits for them; whoever reads the masters or the optimizer state between steps calls
// it first. A job's exception is rethrown by run() (or, for an update, by settle() or the next
// run()) after every job in flight has finished, so nothing outlives what it touches; after a
// failed run every unit is released.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "memory/residency/residency.h"
#include "memory/swap/host_home.h"
#include "memory/swap/swap_plan.h"
#include "memory/swap/swap_simulate.h"
#include "memory/copy_streams.h"

namespace tessera::swap {

struct SwapWork {
  std::function<void(const Action&)> compute;                   // COMPUTE_F, COMPUTE_B
  std::function<std::function<void()>(const Action&)> update;  // OPTIM
  std::function<void()> gradients_stored;
};

using Timeline = std::shared_ptr<std::vector<TimedAction>>;

class SwapExecutor {
 public:
  // `home`: the swapped model's units, one per sub-model and the ends (unit_of); outlives this.
  explicit SwapExecutor(HostHome& home);
  ~SwapExecutor();  // settles, ignoring an update's failure (the step that owned it is gone)
  // The measured timeline: one entry per action, seconds since the run started; the OPTIMs'
  // entries are complete once settle() returned.
  Timeline run(const SwapPlan& plan, const SwapWork& work);
  // Waits for the updates still running from the last run(); rethrows the first failure.
  void settle();
  // The residency layer over the home, for what runs between steps (evaluation).
  Residency& residency() { return residency_; }

 private:
  HostHome& home_;
  Residency residency_;
  Worker host_;
  std::map<int64_t, Ticket> updating_;  // by sub-model (kEnds: the ends): OPTIMs still running
};

}  // namespace tessera::swap
