// The one executor of swap plans (swap_plan.h): runs a plan's actions in issue order, each on its
// stream, and records when each ran (the measured timeline, drawn by swap_timeline.h).
//
//   compute  COMPUTE_F/B on the calling thread (work.compute), after waiting for the tickets of
//            the sub-model's LOAD and the ends' LOAD, and a backward also for its sub-model's and
//            the ends' STORE_GRAD still in flight (the gradients it would add to must be gone)
//   load     LOAD jobs on the load Worker, issued with the COMPUTE before them (the compute holds
//            the calling thread until done, and the plan's LOAD overlaps it); a LOAD first waits
//            for the sub-model's EVICT when that ran on the store stream (its memory must be
//            released before it is filled again) and for the sub-model's OPTIM of the previous
//            step when that is still running (it loads the updated masters)
//   store    STORE_GRAD jobs on the store Worker; an EVICT of a sub-model with a store in flight
//            follows it there, any other EVICT runs on the calling thread at once
//   host     OPTIM jobs on the host Worker, each after its sub-model's last STORE_GRAD; in a plan
//            with defer_optim, work.gradients_stored runs there first, once, after every store
//            (the norm and clipping); otherwise it runs on the calling thread after the plan
// run() returns once everything but the OPTIMs has finished (and, deferred, the norm): the
// updates run on into the next step, whose LOADs wait for them, so they overlap its forward.
// settle() waits for them; whoever reads the masters or the optimizer state between steps calls
// it first. Jobs are made (work.job) on the calling thread when their action is issued, so a
// copy's CUDA event `ready` follows the compute queued before it (swap_streams.h). A job's
// exception is rethrown by run() (or, for an update, by settle() or the next run()) after every
// job in flight has finished, so nothing outlives what it touches.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "memory/swap/swap_plan.h"
#include "memory/swap/swap_simulate.h"
#include "memory/swap/swap_streams.h"

namespace tessera::swap {

struct SwapWork {
  std::function<void(const Action&)> compute;                 // COMPUTE_F, COMPUTE_B
  std::function<std::function<void()>(const Action&)> job;   // LOAD, STORE_GRAD, OPTIM, EVICT
  std::function<void()> gradients_stored;
};

using Timeline = std::shared_ptr<std::vector<TimedAction>>;

class SwapExecutor {
 public:
  SwapExecutor();
  ~SwapExecutor();  // settles, ignoring an update's failure (the step that owned it is gone)
  // The measured timeline: one entry per action, seconds since the run started; the OPTIMs'
  // entries are complete once settle() returned.
  Timeline run(const SwapPlan& plan, const SwapWork& work);
  // Waits for the updates still running from the last run(); rethrows the first failure.
  void settle();

 private:
  Worker load_, store_, host_;
  std::map<int64_t, Ticket> updating_;  // by sub-model (kEnds: the ends): OPTIMs still running
};

}  // namespace tessera::swap
