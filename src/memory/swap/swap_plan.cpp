// Swap plans: the ATOM order, device occupancy, validation and text (swap_plan.h).
#include "memory/swap/swap_plan.h"

#include <algorithm>
#include <cstdio>

#include "core/error.h"

namespace tessera::swap {
namespace {

const char* op_text(Op op) {
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

std::string gib(double bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3f GiB", bytes / (1024.0 * 1024.0 * 1024.0));
  return text;
}

[[noreturn]] void refuse_action(const SwapPlan& plan, int64_t index, const std::string& what) {
  fail("swap plan (", plan.subs.size(), " sub-models, device budget ", gib(plan.device_budget_bytes), "): action ",
       index >= 0 ? plan.actions[index].str() : std::string("-"), " (position ", index, "): ", what, "\n",
       format_swap_plan(plan, index));
}

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

std::string Action::str() const { return std::string(op_text(op)) + " " + std::to_string(sub); }

SwapPlan build_swap_plan(std::vector<SubModel> subs, double device_budget_bytes, double bandwidth) {
  require(!subs.empty(), "internal: a swap plan of no sub-models");
  SwapPlan plan;
  plan.subs = std::move(subs);
  plan.device_budget_bytes = device_budget_bytes;
  plan.bandwidth = bandwidth;
  const auto n = static_cast<int64_t>(plan.subs.size());
  std::vector<Action>& a = plan.actions;
  a.push_back({Op::Load, 0});
  for (int64_t i = 0; i < n; ++i) {
    a.push_back({Op::ComputeF, i});
    if (i + 1 < n) a.push_back({Op::Load, i + 1});  // prefetch while i computes
    if (i + 1 < n) a.push_back({Op::Evict, i});     // the last stays resident into backward
  }
  for (int64_t i = n - 1; i >= 0; --i) {
    a.push_back({Op::ComputeB, i});
    if (i > 0) a.push_back({Op::Load, i - 1});
    a.push_back({Op::StoreGrad, i});
    a.push_back({Op::Evict, i});
    a.push_back({Op::Optim, i});
  }
  return plan;
}

Occupancy occupancy(const SwapPlan& plan) {
  Occupancy o;
  double used = 0;
  std::vector<bool> has_grad(plan.subs.size(), false);
  for (const Action& a : plan.actions) {
    const SubModel& s = plan.subs[static_cast<size_t>(a.sub)];
    switch (a.op) {
      case Op::Load: used += s.parameter_bytes; break;
      case Op::ComputeF: used += s.activation_bytes; break;
      case Op::ComputeB:
        used += s.gradient_bytes - s.activation_bytes;
        has_grad[a.sub] = true;
        break;
      case Op::Evict:
        used -= s.parameter_bytes + (has_grad[a.sub] ? s.gradient_bytes : 0);
        has_grad[a.sub] = false;
        break;
      default: break;
    }
    o.after.push_back(used);
    o.peak = std::max(o.peak, used);
  }
  return o;
}

void validate_swap_plan(const SwapPlan& plan) {
  const auto n = static_cast<int64_t>(plan.subs.size());
  require(n > 0, "internal: a swap plan of no sub-models");
  enum class Where { host, loaded, evicted };
  std::vector<Where> where(n, Where::host);
  std::vector<int> forward(n, 0), backward(n, 0), stored(n, 0), optimized(n, 0);
  int64_t next_forward = 0, next_backward = n - 1;
  const Occupancy o = occupancy(plan);
  for (int64_t k = 0; k < static_cast<int64_t>(plan.actions.size()); ++k) {
    const Action& a = plan.actions[k];
    if (a.sub < 0 || a.sub >= n) refuse_action(plan, k, "there is no sub-model " + std::to_string(a.sub));
    const std::string sub = "sub-model " + std::to_string(a.sub);
    switch (a.op) {
      case Op::Load:
        if (where[a.sub] == Where::loaded) refuse_action(plan, k, sub + " is loaded already");
        where[a.sub] = Where::loaded;
        break;
      case Op::ComputeF:
      case Op::ComputeB: {
        const bool f = a.op == Op::ComputeF;
        if (f && a.sub != next_forward)
          refuse_action(plan, k, "forward out of order: sub-model " + std::to_string(next_forward) + " comes next");
        if (!f && (next_forward < n || a.sub != next_backward))
          refuse_action(plan, k, next_forward < n ? "a backward before every forward ran"
                                                  : "backward out of order: sub-model " + std::to_string(next_backward) + " comes next");
        if (where[a.sub] != Where::loaded)
          refuse_action(plan, k, "computes " + sub + ", which is not loaded (no LOAD before it since its last EVICT)");
        (f ? forward : backward)[a.sub] += 1;
        if (f) ++next_forward;
        else --next_backward;
        break;
      }
      case Op::StoreGrad:
        if (!backward[a.sub]) refuse_action(plan, k, "stores the gradients of " + sub + " before its backward");
        if (stored[a.sub]++) refuse_action(plan, k, "stores " + sub + "'s gradients twice");
        break;
      case Op::Optim:
        if (!stored[a.sub]) refuse_action(plan, k, "updates " + sub + " before its gradients are stored to the host");
        if (optimized[a.sub]++) refuse_action(plan, k, "updates " + sub + " twice");
        break;
      case Op::Evict:
        if (where[a.sub] != Where::loaded) refuse_action(plan, k, "evicts " + sub + ", which is not loaded");
        if (backward[a.sub] && !stored[a.sub]) refuse_action(plan, k, "evicts " + sub + " before its gradients are stored");
        where[a.sub] = Where::evicted;
        break;
    }
    if (o.after[k] > plan.device_budget_bytes)
      refuse_action(plan, k, "the device would hold " + gib(o.after[k]) + ", above its budget of " +
                                 gib(plan.device_budget_bytes) + " (memory.device_budget_gb)");
  }
  for (int64_t i = 0; i < n; ++i) {
    const std::string sub = "sub-model " + std::to_string(i);
    if (forward[i] != 1 || backward[i] != 1) refuse_action(plan, -1, sub + " lacks its forward or its backward");
    if (!optimized[i]) refuse_action(plan, -1, sub + " is never updated (no OPTIM)");
    if (where[i] == Where::loaded) refuse_action(plan, -1, sub + " is still on the device at the end of the step");
  }
}

std::string format_swap_plan(const SwapPlan& plan, int64_t mark) {
  const Occupancy o = occupancy(plan);
  std::string out;
  char line[160];
  for (size_t k = 0; k < plan.actions.size(); ++k) {
    const Action& a = plan.actions[k];
    std::snprintf(line, sizeof line, "%s %4zu  %-7s  %-13s  (device %s)\n",
                  static_cast<int64_t>(k) == mark ? ">>" : "  ", k, stream_name(stream_of(a.op)), a.str().c_str(),
                  gib(o.after[k]).c_str());
    out += line;
  }
  return out;
}

}  // namespace tessera::swap
