// The swap plan executor (swap_executor.h).
#include "memory/swap/swap_executor.h"

#include <chrono>
#include <exception>

#include "core/error.h"
#include "core/fault_injection.h"

namespace tessera::swap {
namespace {

// Waits for every Work; returns the first failure (null if none).
std::exception_ptr wait_all(std::vector<comm::Work> works) {
  std::exception_ptr failure;
  for (comm::Work& w : works) {
    try {
      w.wait();
    } catch (...) {
      if (!failure) failure = std::current_exception();
    }
  }
  return failure;
}

std::vector<comm::Work> works_of(const std::map<int64_t, Ticket>& tickets) {
  std::vector<comm::Work> out;
  for (const auto& [sub, t] : tickets) out.emplace_back(t);
  return out;
}

}  // namespace

SwapExecutor::SwapExecutor(HostHome& home) : home_(home), residency_(home), host_("swap host") {}

SwapExecutor::~SwapExecutor() { wait_all(works_of(updating_)); }

void SwapExecutor::settle() {
  std::vector<comm::Work> left = works_of(updating_);
  updating_.clear();
  if (std::exception_ptr failure = wait_all(std::move(left))) std::rethrow_exception(failure);
}

Timeline SwapExecutor::run(const SwapPlan& plan, const SwapWork& work) {
  using clock = std::chrono::steady_clock;
  const auto epoch = clock::now();
  auto timeline = std::make_shared<std::vector<TimedAction>>(plan.actions.size());
  auto now = [epoch] { return std::chrono::duration<double>(clock::now() - epoch).count(); };
  home_.set_clock(now);
  auto unit = [&](int64_t sub) { return unit_of(sub, plan.size()); };
  // The home's next movement reports into entry k of the timeline.
  auto trace = [&](size_t k) {
    home_.trace_next([timeline, k](double start, double end) {
      (*timeline)[k].start = start;
      (*timeline)[k].end = end;
    });
  };
  std::map<int64_t, comm::Work> stored;                    // per sub-model, its last STORE_GRAD
  std::map<int64_t, Ticket> updating = std::move(updating_);  // the last step's OPTIMs still running
  updating_.clear();
  std::vector<comm::Work> stores;
  comm::Work barrier;  // the deferred norm, after every store
  bool barrier_issued = false;
  std::vector<bool> issued(plan.actions.size(), false);
  auto issue_load = [&](size_t k) {
    fault::point("swap.load");
    trace(k);
    residency_.fetch(unit(plan.actions[k].sub));
    home_.trace_next(nullptr);  // a unit already resident moved nothing
    issued[k] = true;
  };
  std::exception_ptr failure;
  try {
    for (size_t k = 0; k < plan.actions.size(); ++k) {
      const Action& a = plan.actions[k];
      (*timeline)[k].action = a;
      if (issued[k]) continue;
      switch (a.op) {
        case Op::ComputeF:
        case Op::ComputeB: {
          // The loads that follow this compute in the plan go first: the compute holds this
          // thread until it is done (on CUDA it would only be queued), and they overlap it.
          for (size_t j = k + 1; j < plan.actions.size(); ++j) {
            const Op op = plan.actions[j].op;
            if (op == Op::ComputeF || op == Op::ComputeB) break;
            if (op == Op::Load) {
              (*timeline)[j].action = plan.actions[j];
              issue_load(j);
            }
          }
          residency_.complete(unit(a.sub));
          residency_.complete(unit(kEnds));
          if (a.op == Op::ComputeB) {  // its gradients, and the ends', must be stored and gone
            stored[a.sub].wait();
            stored[kEnds].wait();
          }
          (*timeline)[k].start = now();
          work.compute(a);
          (*timeline)[k].end = now();
          break;
        }
        case Op::Load:
          issue_load(k);
          break;
        case Op::StoreGrad:
          fault::point("swap.store");
          trace(k);
          stored[a.sub] = home_.store(unit(a.sub));
          residency_.reads(unit(a.sub), stored[a.sub]);
          stores.push_back(stored[a.sub]);
          break;
        case Op::Evict:
          trace(k);
          residency_.release(unit(a.sub));
          home_.trace_next(nullptr);
          break;
        case Op::Optim: {
          if (plan.defer_optim && !barrier_issued) {
            barrier = comm::Work(host_.submit([stores, &work]() mutable {
              for (comm::Work& w : stores) w.wait();
              work.gradients_stored();
            }));
            barrier_issued = true;
          }
          const comm::Work after = stored[a.sub];
          updating_[a.sub] = host_.submit([timeline, k, now, after, job = work.update(a)]() mutable {
            comm::Work(after).wait();
            (*timeline)[k].start = now();
            job();
            (*timeline)[k].end = now();
          });
          residency_.writes(unit(a.sub), comm::Work(updating_[a.sub]));
          break;
        }
      }
    }
  } catch (...) {
    failure = std::current_exception();
  }
  // Everything but this step's updates: the stores, the evictions on the store stream, the
  // deferred norm, and a last step's update no LOAD waited for.
  home_.drain();
  std::vector<comm::Work> waited = stores;
  for (comm::Work& w : works_of(updating)) waited.push_back(w);
  waited.push_back(barrier);
  std::exception_ptr first = wait_all(std::move(waited));
  if (!failure) failure = first;
  if (failure) {
    wait_all(works_of(updating_));  // nothing may run on after a failed step
    updating_.clear();
    residency_.reset();
    std::rethrow_exception(failure);
  }
  if (!plan.defer_optim) work.gradients_stored();
  return timeline;
}

}  // namespace tessera::swap
