// Swap plans: the ATOM order, device occupancy, validation and text (swap_plan.h).
#include "memory/swap/swap_plan.h"

#include <algorithm>
#include <cstdio>

#include "core/error.h"

namespace tessera::swap {
namespace {

[[noreturn]] void refuse_action(const SwapPlan& plan, int64_t index, const std::string& what) {
  fail("swap plan (", plan.subs.size(), " sub-models, ", plan.micro_batches, " micro-batches, device budget ",
       format_mib(plan.device_budget_bytes), "): action ", index >= 0 ? plan.actions[index].str() : std::string("-"),
       " (position ", index, "): ", what, "\n", format_swap_plan(plan, index));
}

// Per-sub-model arrays hold the ends last.
size_t slot(const SwapPlan& plan, int64_t sub) { return static_cast<size_t>(sub == kEnds ? plan.size() : sub); }

std::string sub_name(int64_t sub) { return sub == kEnds ? std::string("the ends") : "sub-model " + std::to_string(sub); }

}  // namespace

Stream stream_of(Op op) {
  switch (op) {
    case Op::Load: return Stream::load;
    case Op::StoreGrad: return Stream::store;
    case Op::Optim: return Stream::host;
    default: return Stream::compute;
  }
}

const char* stream_name(Stream stream) {
  switch (stream) {
    case Stream::compute: return "compute";
    case Stream::load: return "load";
    case Stream::store: return "store";
    case Stream::host: return "host";
  }
  return "?";
}

const char* op_name(Op op) {
  switch (op) {
    case Op::Load: return "LOAD";
    case Op::ComputeF: return "COMPUTE_F";
    case Op::ComputeB: return "COMPUTE_B";
    case Op::StoreGrad: return "STORE_GRAD";
    case Op::Optim: return "OPTIM";
    case Op::Evict: return "EVICT";
  }
  return "?";
}

std::string Action::str() const {
  std::string s = std::string(op_name(op)) + " " + (sub == kEnds ? std::string("ends") : std::to_string(sub));
  return micro > 0 ? s + " mb" + std::to_string(micro) : s;
}

SwapPlan build_swap_plan(SwapPlan plan) {
  require(!plan.subs.empty() && plan.micro_batches >= 1, "internal: a swap plan of no sub-models or micro-batches");
  const int64_t n = plan.size(), mbs = plan.micro_batches;
  std::vector<Action>& a = plan.actions;
  a.clear();
  a.push_back({Op::Load, kEnds});
  a.push_back({Op::Load, 0});
  for (int64_t m = 0; m < mbs; ++m) {
    const bool last_micro = m + 1 == mbs;
    for (int64_t i = 0; i < n; ++i) {
      a.push_back({Op::ComputeF, i, m});
      if (i + 1 < n) {
        a.push_back({Op::Load, i + 1, m});  // prefetch while i computes
        a.push_back({Op::Evict, i, m});     // the last stays resident into backward
      }
    }
    for (int64_t i = n - 1; i >= 0; --i) {
      a.push_back({Op::ComputeB, i, m});
      if (i > 0) a.push_back({Op::Load, i - 1, m});
      if (i == 0) a.push_back({Op::StoreGrad, kEnds, m});
      a.push_back({Op::StoreGrad, i, m});
      if (i == 0 && !last_micro) continue;  // stays resident into the next forward
      a.push_back({Op::Evict, i, m});
      if (last_micro && !plan.defer_optim) a.push_back({Op::Optim, i});
    }
  }
  a.push_back({Op::Evict, kEnds, mbs - 1});
  a.push_back({Op::Optim, kEnds});
  if (plan.defer_optim)  // in the order the next step loads them
    for (int64_t i = 0; i < n; ++i) a.push_back({Op::Optim, i});
  return plan;
}

SwapPlan forward_only_swap_plan(SwapPlan plan) {
  require(!plan.subs.empty(), "internal: a swap plan of no sub-models");
  const int64_t n = plan.size();
  plan.micro_batches = 1;
  plan.defer_optim = false;
  std::vector<Action>& a = plan.actions;
  a.clear();
  a.push_back({Op::Load, kEnds});
  a.push_back({Op::Load, 0});
  for (int64_t i = 0; i < n; ++i) {
    a.push_back({Op::ComputeF, i});
    if (i + 1 < n) a.push_back({Op::Load, i + 1});
    a.push_back({Op::Evict, i});
  }
  a.push_back({Op::Evict, kEnds});
  return plan;
}

Occupancy occupancy(const SwapPlan& plan) {
  Occupancy o;
  double used = 0;
  std::vector<bool> has_grad(plan.subs.size() + 1, false);
  for (const Action& a : plan.actions) {
    const SubModel& s = plan.sub(a.sub);
    const size_t k = slot(plan, a.sub);
    switch (a.op) {
      case Op::Load:
        used += s.parameter_bytes;
        if (a.sub == kEnds) {
          used += s.gradient_bytes;
          has_grad[k] = true;
        }
        break;
      case Op::ComputeF: used += s.activation_bytes; break;
      case Op::ComputeB:
        used -= s.activation_bytes;
        if (!has_grad[k]) used += s.gradient_bytes;
        has_grad[k] = true;
        break;
      case Op::Evict:
        used -= s.parameter_bytes + (has_grad[k] ? s.gradient_bytes : 0);
        has_grad[k] = false;
        break;
      default: break;
    }
    o.after.push_back(used);
    o.peak = std::max(o.peak, used);
  }
  return o;
}

void validate_swap_plan(const SwapPlan& plan) {
  const int64_t n = plan.size(), mbs = plan.micro_batches;
  require(n > 0 && mbs > 0, "internal: a swap plan of no sub-models or micro-batches");
  struct State {
    bool loaded = false;
    bool unstored = false;     // gradients made on the device since the last store
    int64_t forwards = 0, backwards = 0;
    bool stored_final = false;  // the last micro-batch's gradients are on the host
    bool optimized = false;
  };
  std::vector<State> st(n + 1);
  int64_t micro = 0, next_forward = 0, next_backward = n - 1;  // where the compute stream is
  int64_t stored_final = 0;
  const Occupancy o = occupancy(plan);
  for (int64_t k = 0; k < static_cast<int64_t>(plan.actions.size()); ++k) {
    const Action& a = plan.actions[k];
    if (a.sub != kEnds && (a.sub < 0 || a.sub >= n))
      refuse_action(plan, k, "there is no sub-model " + std::to_string(a.sub));
    State& s = st[slot(plan, a.sub)];
    const std::string sub = sub_name(a.sub);
    switch (a.op) {
      case Op::Load:
        if (s.loaded) refuse_action(plan, k, sub + " is loaded already");
        s.loaded = true;
        break;
      case Op::ComputeF:
      case Op::ComputeB: {
        const bool f = a.op == Op::ComputeF;
        if (a.sub == kEnds) refuse_action(plan, k, "the ends compute within the first and last sub-models");
        if (a.micro != micro) refuse_action(plan, k, "micro-batch " + std::to_string(micro) + " is not finished");
        if (f && a.sub != next_forward)
          refuse_action(plan, k, next_forward < n ? "forward out of order: sub-model " + std::to_string(next_forward) + " comes next"
                                                  : "a second forward before the backward");
        if (!f && (next_forward < n || a.sub != next_backward))
          refuse_action(plan, k, next_forward < n ? "a backward before every forward ran"
                                                  : "backward out of order: sub-model " + std::to_string(next_backward) + " comes next");
        if (!s.loaded)
          refuse_action(plan, k, "computes " + sub + ", which is not loaded (no LOAD before it since its last EVICT)");
        if (!st[n].loaded) refuse_action(plan, k, "computes " + sub + " without the ends (embeddings, ln_f) loaded");
        if (f) {
          ++s.forwards;
          ++next_forward;
        } else {
          ++s.backwards;
          s.unstored = true;
          st[n].unstored = true;
          if (--next_backward < 0) {  // the micro-batch is done
            ++micro;
            next_forward = 0;
            next_backward = n - 1;
          }
        }
        break;
      }
      case Op::StoreGrad:
        if (!s.unstored) refuse_action(plan, k, "stores the gradients of " + sub + ", but no backward made new ones");
        s.unstored = false;
        if (a.sub == kEnds ? micro == mbs : s.backwards == mbs) {
          s.stored_final = true;
          ++stored_final;
        }
        break;
      case Op::Optim:
        if (!s.stored_final)
          refuse_action(plan, k, "updates " + sub + " before its last micro-batch's gradients are stored to the host");
        if (s.optimized) refuse_action(plan, k, "updates " + sub + " twice");
        if (plan.defer_optim && stored_final < n + 1)
          refuse_action(plan, k, "updates " + sub + " before every gradient is on the host: clipping (optim.grad_clip) "
                                 "needs the global norm");
        s.optimized = true;
        break;
      case Op::Evict:
        if (!s.loaded) refuse_action(plan, k, "evicts " + sub + ", which is not loaded");
        if (s.unstored) refuse_action(plan, k, "evicts " + sub + " before its gradients are stored");
        s.loaded = false;
        break;
    }
    if (o.after[k] > plan.device_budget_bytes)
      refuse_action(plan, k, "the device would hold " + format_mib(o.after[k]) + ", above its budget of " +
                                 format_mib(plan.device_budget_bytes) +
                                 (plan.reserved_bytes > 0 ? " (memory.device_budget_gb less " +
                                                                format_mib(plan.reserved_bytes) + " reserved)"
                                                          : std::string(" (memory.device_budget_gb)")));
  }
  for (int64_t i = kEnds; i < n; ++i) {
    const State& s = st[slot(plan, i)];
    const std::string sub = sub_name(i);
    if (i != kEnds && (s.forwards != mbs || s.backwards != mbs))
      refuse_action(plan, -1, sub + " lacks a forward or a backward of its " + std::to_string(mbs) + " micro-batches");
    if (!s.optimized) refuse_action(plan, -1, sub + " is never updated (no OPTIM)");
    if (s.loaded) refuse_action(plan, -1, sub + " is still on the device at the end of the step");
  }
}

std::string format_mib(double bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f MiB", bytes / (1024.0 * 1024.0));
  return text;
}

std::string format_swap_plan(const SwapPlan& plan, int64_t mark) {
  const Occupancy o = occupancy(plan);
  std::string out;
  char line[160];
  for (size_t k = 0; k < plan.actions.size(); ++k) {
    const Action& a = plan.actions[k];
    std::snprintf(line, sizeof line, "%s %4zu  %-7s  %-17s  (device %s)\n",
                  static_cast<int64_t>(k) == mark ? ">>" : "  ", k, stream_name(stream_of(a.op)), a.str().c_str(),
                  format_mib(o.after[k]).c_str());
    out += line;
  }
  return out;
}

}  // namespace tessera::swap
