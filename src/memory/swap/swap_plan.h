// ATOM swap plans as data (DESIGN.md "Schedules are data"; issue 14): the model lives in host
// memory and is cut into contiguous sub-models that pass through the device one after another.
// A plan is one list of actions in issue order, each run on its stream:
//
//   LOAD i        load stream    sub-model i's compute parameters, host -> device
//   COMPUTE_F i   compute stream its forward (activations stay on the device for its backward)
//   COMPUTE_B i   compute stream its backward (its activations freed, its gradients made)
//   STORE_GRAD i  store stream   its gradients, device -> host (added to the host gradient after
//                                the step's first micro-batch)
//   OPTIM i       host           the optimizer over sub-model i's host state, once its last
//                                gradients arrived (overlaps the device's backward of earlier
//                                sub-models)
//   EVICT i       (none)         frees sub-model i's parameters and gradients on the device, once
//                                the compute stream is past them and its gradients are stored
//
// The ends (token and position embeddings, ln_f: sub = kEnds, "ends") are loaded first and stay
// on the device for the whole step: wte serves both the first sub-model (the embedding) and the
// last (the tied head), so within a micro-batch its gradient sums both uses on the device, as in a
// resident backward, and is stored after the micro-batch's last backward (then added on the host
// in micro-batch order, as a resident run accumulates).
//
// build_swap_plan gives ATOM's order for each micro-batch: forward loads sub-model i+1 while i
// computes and evicts i after its forward, except the last, which stays resident into backward
// (the top turn); backward walks the sub-models in reverse with the same prefetch, storing each
// one's gradients and evicting it; sub-model 0 stays resident into the next micro-batch's forward
// (the bottom turn: its gradients are stored, its parameters stay). After
// the last micro-batch the host updates each sub-model as its gradients arrive, or, with
// defer_optim (clipping: the clip coefficient needs the global norm, so every gradient must be on
// the host first), every sub-model after the last store, the ends first and then in forward
// order: the order the next step loads them, so the updates overlap its forward (the executor
// lets a step's OPTIMs run on while the next step starts; each LOAD waits for its update).
//
// Device memory, in issue order (occupancy): LOAD adds the parameters (the ends: and their
// gradients), COMPUTE_F the activations, COMPUTE_B frees those activations and adds the gradients
// (once: later micro-batches accumulate into them), EVICT frees parameters and gradients.
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
const char* op_name(Op op);

constexpr int64_t kEnds = -1;  // the sub index of the ends
// The residency unit of sub-model `sub` (the ends: unit `subs`) in a model of `subs` sub-models.
inline size_t unit_of(int64_t sub, int64_t subs) { return static_cast<size_t>(sub == kEnds ? subs : sub); }

struct Action {
  Op op = Op::Load;
  int64_t sub = 0;    // a sub-model, or kEnds
  int64_t micro = 0;  // the micro-batch of a COMPUTE, STORE_GRAD or EVICT (0 for the others)
  bool operator==(const Action& o) const { return op == o.op && sub == o.sub && micro == o.micro; }
  std::string str() const;  // "LOAD 3", "COMPUTE_F 0", "STORE_GRAD ends", "COMPUTE_B 2 mb1" (micro > 0)
};

// One sub-model: blocks [first, end) of the model, its bytes and its costs for one micro-batch.
// The ends use the bytes and optim_s only (their compute is part of the first and last
// sub-models' times).
struct SubModel {
  int64_t first = 0, end = 0;
  double parameter_bytes = 0;   // the compute copy loaded for each pass
  double gradient_bytes = 0;    // made by its backward, stored to the host
  double activation_bytes = 0;  // held from its forward to its backward
  double forward_s = 0, backward_s = 0;  // compute
  double optim_s = 0;                    // the host optimizer over its state
};

struct SwapPlan {
  std::vector<SubModel> subs;
  SubModel ends;
  double device_budget_bytes = 0;  // memory.device_budget_gb less reserved_bytes
  // Kept out of the budget for what the sub-models do not count: offloaded activation groups in
  // flight, a recomputed block's whole activations (plan/swap_cut.h).
  double reserved_bytes = 0;
  double bandwidth = 0;            // host <-> device bytes per second, each direction
  double load_fraction = 1;        // link bytes of a LOAD per device parameter byte (0.5: bf16 copies)
  int64_t micro_batches = 1;
  bool defer_optim = false;        // every OPTIM after the last STORE_GRAD (clipping)
  // Host seconds of the step's pass over every host gradient (the norm, and under clipping their
  // scaling): on the host stream before the first OPTIM when deferred, else after the step.
  double gradients_stored_s = 0;
  std::vector<Action> actions;     // in issue order

  int64_t size() const { return static_cast<int64_t>(subs.size()); }
  const SubModel& sub(int64_t i) const { return i == kEnds ? ends : subs[static_cast<size_t>(i)]; }
  // K + 1 block indices: sub-model i holds blocks [boundaries()[i], boundaries()[i + 1]).
  std::vector<int64_t> boundaries() const {
    std::vector<int64_t> out{0};
    for (const SubModel& s : subs) out.push_back(s.end);
    return out;
  }
};

// `plan` with its actions in ATOM's order (any actions given are replaced).
SwapPlan build_swap_plan(SwapPlan plan);

// Evaluation's plan, run by the same executor: the forward alone of all the batches at once
// (micro 0), sub-model after sub-model with ATOM's prefetch (sub-model i+1 loads while i computes,
// i is evicted after it), then the ends evicted: the ends and at most two sub-models resident. No
// backward, store or update (validate_swap_plan, which holds training plans to their order,
// would refuse it).
SwapPlan forward_only_swap_plan(SwapPlan plan);

// Device bytes in use after each action of plan.actions, and the most.
struct Occupancy {
  std::vector<double> after;
  double peak = 0;
};
Occupancy occupancy(const SwapPlan& plan);

void validate_swap_plan(const SwapPlan& plan);

// One line per action: "  12  compute  COMPUTE_F 3  (device 12.3 MiB)", `mark` drawn as ">>".
std::string format_swap_plan(const SwapPlan& plan, int64_t mark = -1);

// "12.3 MiB": the unit the swap engine's messages use.
std::string format_mib(double bytes);

}  // namespace tessera::swap
