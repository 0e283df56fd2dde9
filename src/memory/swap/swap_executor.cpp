// The swap plan executor (swap_executor.h).
#include "memory/swap/swap_executor.h"

#include <chrono>
#include <exception>
#include <map>

#include "core/error.h"

namespace tessera::swap {
namespace {

void wait(const Ticket& t) {
  if (t.valid()) t.get();
}

}  // namespace

SwapExecutor::SwapExecutor() : load_("swap load"), store_("swap store"), host_("swap host") {}

std::vector<TimedAction> SwapExecutor::run(const SwapPlan& plan, const SwapWork& work) {
  using clock = std::chrono::steady_clock;
  const auto epoch = clock::now();
  auto now = [&] { return std::chrono::duration<double>(clock::now() - epoch).count(); };
  std::vector<TimedAction> timeline(plan.actions.size());
  // Per sub-model (by index; the ends at key kEnds): the tickets still relevant.
  std::map<int64_t, Ticket> loaded, stored, evicted_on_store;
  std::vector<Ticket> all;  // every job, to wait for before returning
  bool barrier_issued = false;
  auto timed = [&](size_t k, std::function<void()> job, std::vector<Ticket> after) {
    return [&timeline, k, now, job = std::move(job), after = std::move(after)] {
      for (const Ticket& t : after) wait(t);
      timeline[k].start = now();
      job();
      timeline[k].end = now();
    };
  };
  std::vector<bool> issued(plan.actions.size(), false);
  auto issue_load = [&](size_t k) {
    const Action& a = plan.actions[k];
    std::vector<Ticket> after;
    if (evicted_on_store.count(a.sub)) after.push_back(evicted_on_store[a.sub]);
    evicted_on_store.erase(a.sub);
    loaded[a.sub] = load_.submit(timed(k, work.job(a), std::move(after)));
    all.push_back(loaded[a.sub]);
    issued[k] = true;
  };
  std::exception_ptr failure;
  try {
    for (size_t k = 0; k < plan.actions.size(); ++k) {
      const Action& a = plan.actions[k];
      timeline[k].action = a;
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
              timeline[j].action = plan.actions[j];
              issue_load(j);
            }
          }
          wait(loaded[a.sub]);
          wait(loaded[kEnds]);
          if (a.op == Op::ComputeB) {  // its gradients, and the ends', must be stored and gone
            wait(stored[a.sub]);
            wait(stored[kEnds]);
          }
          timeline[k].start = now();
          work.compute(a);
          timeline[k].end = now();
          break;
        }
        case Op::Load:
          issue_load(k);
          break;
        case Op::StoreGrad:
          stored[a.sub] = store_.submit(timed(k, work.job(a), {}));
          all.push_back(stored[a.sub]);
          break;
        case Op::Evict: {
          const auto it = stored.find(a.sub);
          if (it != stored.end() && it->second.valid() &&
              it->second.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
            evicted_on_store[a.sub] = store_.submit(timed(k, work.job(a), {}));
            all.push_back(evicted_on_store[a.sub]);
          } else {
            timed(k, work.job(a), {})();
          }
          break;
        }
        case Op::Optim: {
          if (plan.defer_optim && !barrier_issued) {
            std::vector<Ticket> stores;
            for (const auto& [sub, t] : stored) stores.push_back(t);
            all.push_back(host_.submit([stores, &work] {
              for (const Ticket& t : stores) wait(t);
              work.gradients_stored();
            }));
            barrier_issued = true;
          }
          all.push_back(host_.submit(timed(k, work.job(a), {stored[a.sub]})));
          break;
        }
      }
    }
  } catch (...) {
    failure = std::current_exception();
  }
  for (const Ticket& t : all) {
    try {
      wait(t);
    } catch (...) {
      if (!failure) failure = std::current_exception();
    }
  }
  if (failure) std::rethrow_exception(failure);
  if (!plan.defer_optim) work.gradients_stored();
  return timeline;
}

}  // namespace tessera::swap
