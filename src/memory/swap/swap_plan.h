// ATOM swap plans as data (DESIGN.md "Schedules are data"; issue 14): the model lives in host
// memory and is cut into contiguous sub-models that pass through the device one after another.
// A plan is one list of actions in issue order, each run on its stream:
//
//   LOAD i        load stream    sub-model i's compute parameters, host -> device
//   COMPUTE_F i   compute stream its forward (activations stay on the device for its backward)
//   COMPUTE_B i   compute stream its backward (its activations freed, its gradients made)
//   STORE_GRAD i  store stream   its gradients, device -> host
//   OPTIM i       host           the optimizer over sub-model i's host state, once its gradients
//                                arrived (overlaps the device's backward of earlier sub-models)
//   EVICT i       compute stream frees sub-model i's parameters (and stored gradients) on the
//                                device, once the compute stream is past its last use
//
// build_swap_plan gives ATOM's order: forward loads sub-model i+1 while i computes and evicts i
// after its forward, except the last, which stays resident into backward; backward walks the
// sub-models in reverse with the same prefetch, storing each one's gradients and evicting it,
// and the host updates each as its gradients arrive. The LOAD of the next sub-model is issued
// right after the current one's COMPUTE is issued, so the two overlap.
//
// Device memory, in issue order (occupancy): LOAD adds the parameters, COMPUTE_F the activations,
// COMPUTE_B frees those activations and adds the gradients, EVICT frees parameters and gradients.
// validate_swap_plan holds the plan to the budget at every action and to the order above; a
// failure names the action and its position and prints the plan with it marked.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessera::swap {

enum class Op : uint8_t { Load, ComputeF, ComputeB, StoreGrad, Optim, Evict };
enum class Stream : uint8_t { compute, load, store, host };
Stream stream_of(Op op);
const char* stream_name(Stream stream);

struct Action {
  Op op = Op::Load;
  int64_t sub = 0;
  bool operator==(const Action& o) const { return op == o.op && sub == o.sub; }
  std::string str() const;  // "LOAD 3", "COMPUTE_F 0"
};

// One sub-model: blocks [first, end) of the model, its bytes and its costs for one step.
struct SubModel {
  int64_t first = 0, end = 0;
  double parameter_bytes = 0;   // the compute copy (bf16 or fp32) loaded for each pass
  double gradient_bytes = 0;    // made by its backward, stored to the host
  double activation_bytes = 0;  // held from its forward to its backward
  double forward_s = 0, backward_s = 0;  // compute
  double optim_s = 0;                    // the host optimizer over its state
};

struct SwapPlan {
  std::vector<SubModel> subs;
  double device_budget_bytes = 0;  // memory.device_budget_gb
  double bandwidth = 0;            // host <-> device bytes per second, each direction
  std::vector<Action> actions;     // in issue order
};

SwapPlan build_swap_plan(std::vector<SubModel> subs, double device_budget_bytes, double bandwidth);

// Device bytes in use after each action of plan.actions, and the most.
struct Occupancy {
  std::vector<double> after;
  double peak = 0;
};
Occupancy occupancy(const SwapPlan& plan);

void validate_swap_plan(const SwapPlan& plan);

// One line per action: "  12  compute  COMPUTE_F 3  (device 1.20 GiB)", `mark` drawn as ">>".
std::string format_swap_plan(const SwapPlan& plan, int64_t mark = -1);

}  // namespace tessera::swap
