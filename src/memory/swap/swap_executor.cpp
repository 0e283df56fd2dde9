// The swap plan executor (swap_executor.h).
#include "memory/swap/swap_executor.h"

#include <chrono>
#include <exception>

#include "core/error.h"

namespace tessera::swap {
namespace {

void wait(const Ticket& t) {
  if (t.valid()) t.get();
}

// Waits for every ticket; returns the first failure (null if none).
std::exception_ptr wait_all(const std::vector<Ticket>& tickets) {
  std::exception_ptr failure;
  for (const Ticket& t : tickets) {
    try {
      wait(t);
    } catch (...) {
      if (!failure) failure = std::current_exception();
    }
  }
  return failure;
}

}  // namespace

SwapExecutor::SwapExecutor() : load_("swap load"), store_("swap store"), host_("swap host") {}

SwapExecutor::~SwapExecutor() {
  std::vector<Ticket> left;
  for (const auto& [sub, t] : updating_) left.push_back(t);
  wait_all(left);
}

void SwapExecutor::settle() {
  std::vector<Ticket> left;
  for (const auto& [sub, t] : updating_) left.push_back(t);
  updating_.clear();
  if (std::exception_ptr failure = wait_all(left)) std::rethrow_exception(failure);
}

Timeline SwapExecutor::run(const SwapPlan& plan, const SwapWork& work) {
  using clock = std::chrono::steady_clock;
  const auto epoch = clock::now();
  auto timeline = std::make_shared<std::vector<TimedAction>>(plan.actions.size());
  // Per sub-model (by index; the ends at key kEnds): the tickets still relevant.
  std::map<int64_t, Ticket> loaded, stored, evicted_on_store;
  std::map<int64_t, Ticket> updating = std::move(updating_);  // the last step's OPTIMs still running
  updating_.clear();
  std::vector<Ticket> all, optims;  // the jobs to wait for before returning, and the updates
  bool barrier_issued = false;
  auto now = [epoch] { return std::chrono::duration<double>(clock::now() - epoch).count(); };
  auto timed = [timeline, now](size_t k, std::function<void()> job, std::vector<Ticket> after) {
    return [timeline, now, k, job = std::move(job), after = std::move(after)] {
      for (const Ticket& t : after) wait(t);
      (*timeline)[k].start = now();
      job();
      (*timeline)[k].end = now();
    };
  };
  std::vector<bool> issued(plan.actions.size(), false);
  auto issue_load = [&](size_t k) {
    const Action& a = plan.actions[k];
    std::vector<Ticket> after;
    for (auto* before : {&evicted_on_store, &updating}) {
      const auto it = before->find(a.sub);
      if (it == before->end()) continue;
      after.push_back(it->second);
      before->erase(it);
    }
    loaded[a.sub] = load_.submit(timed(k, work.job(a), std::move(after)));
    all.push_back(loaded[a.sub]);
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
          wait(loaded[a.sub]);
          wait(loaded[kEnds]);
          if (a.op == Op::ComputeB) {  // its gradients, and the ends', must be stored and gone
            wait(stored[a.sub]);
            wait(stored[kEnds]);
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
          updating_[a.sub] = host_.submit(timed(k, work.job(a), {stored[a.sub]}));
          optims.push_back(updating_[a.sub]);
          break;
        }
      }
    }
  } catch (...) {
    failure = std::current_exception();
  }
  for (const auto& [sub, t] : updating) all.push_back(t);  // a last step's update no LOAD waited for
  std::exception_ptr first = wait_all(all);
  if (!failure) failure = first;
  if (failure) {
    wait_all(optims);  // nothing may run on after a failed step
    updating_.clear();
    std::rethrow_exception(failure);
  }
  if (!plan.defer_optim) work.gradients_stored();
  return timeline;
}

}  // namespace tessera::swap
