// SwapOwner: the OptimizerOwner of a swapped model (memory.swap = true; ATOM, issue 14), and its
// home in host memory (host_home.h). The model's training state lives in host memory and only the
// sub-models being computed or loaded are on the device; the swap step (parallel/swap_step.h) runs
// the plan (swap_plan.h) through the residency layer over this home (LOAD fetches, EVICT releases,
// STORE_GRAD stores) and calls the host operations below from the plan's host stream.
//
// Units. Sub-model i (blocks [first, end)) is unit i; the ends (wte, wpe, ln_f) are unit K (K
// sub-models; swap::unit_of).
// Every unit's parameters, in model order, are flattened into three host buffers of float32,
// each carved into per-unit views (one allocation each, pinned on CUDA: pinning per tensor forces
// a device sync and rounds every allocation up to a power of two):
//   master    [P]  the values the optimizer updates (the model's parameters)
//   grad      [P]  the step's gradients, accumulated over its micro-batches
//   staging   [max unit]  the landing place of a later micro-batch's gradients before the add
// and the unit's device copy, `device` [N] (float32: autocast casts inside the blocks), whose
// storage exists between a LOAD and an EVICT only. With bf16 copies (memory.swap_copies) a fourth
// buffer, `copies` [P] bfloat16, mirrors the masters (refreshed by each update) and a LOAD moves
// it, half the bytes, widened to float32 on the device: the device computes with the masters
// rounded to bf16, which autocast does to every matmul operand anyway. The model's parameters are
// views of the device copies (set_data), so the autograd graph saved between a sub-model's
// forward and its backward sees the reloaded memory (memory/storage.h, as the residency layer's
// FlatUnit). The optimizer state (AdamW or Adafactor, one optimizer per unit
// over views of master shaped like the parameters) is host memory as well, so a unit's update
// runs on the host stream while the device computes. Per-unit optimizers equal one optimizer over
// the model: both update each parameter on its own.
//
// A parameter whose gradient stayed undefined in every micro-batch (an unused expert) gets no
// gradient in the update either, as in a resident run (its step count does not advance).
//
// Invariants:
// - Between steps every unit is evicted: the device holds nothing of the model.
// - A unit's device storage is written by its LOAD only, on the load stream, and read by the
//   compute stream after the LOAD's ticket; its gradients are read by its STORE_GRAD only.
// - The host gradients of a unit are complete once its last STORE_GRAD of the step ran; the norm
//   and the update read them after that.
// - Data-parallel replicas (each a whole swapped model on its own device) hold equal masters and
//   optimizer state: they apply the same averaged gradients.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "memory/swap/host_home.h"
#include "memory/swap/swap_plan.h"
#include "memory/copy_streams.h"
#include "optim/optim_options.h"
#include "optim/optimizer.h"
#include "protocols/optimizer_owner.h"

namespace tessera {

class SwapOwner : public OptimizerOwner, public GradientHolder, public swap::HostHome {
 public:
  // `params`: the model's named parameters, float32 on the host (the model was built there);
  // `blocks`: each parameter's block (its declaration's, model/parameter_spec.h), -1 for the ends;
  // `boundaries`: K + 1 block indices, sub-model i holds blocks [boundaries[i], boundaries[i+1]).
  // `modelled_bandwidth`: bytes per second of the CPU "device"'s link (memory/copy_streams.h).
  // `replicas`: the data-parallel group of swapped replicas (outlives this), or null.
  // `bf16_copies`: LOADs move bf16 copies of the masters (memory.swap_copies), kept beside them.
  SwapOwner(const NamedParams& params, const std::vector<int64_t>& blocks, std::vector<int64_t> boundaries, const OptimOptions& optim, c10::Device device,
            double modelled_bandwidth, comm::Group* replicas = nullptr, bool bf16_copies = false);
  ~SwapOwner() override;

  int64_t sub_models() const { return static_cast<int64_t>(units_.size()) - 1; }
  // Once every STORE_GRAD of the step ran, in this order:
  // reduce_gradients: with replicas, the host gradients averaged over them (one all-reduce of the
  //   gradient buffer from host memory, and one of which parameters got a gradient on any
  //   replica; a collective of the replicas); nothing without;
  // gradients_stored: the global norm of the host gradients (as clip_grad_norm over the model's
  //   parameters in order), clipped in place to max_norm (> 0).
  void reduce_gradients();
  double gradients_stored(double max_norm);
  // Whether gradients_stored reduces over replicas (the plan must then defer every update).
  bool replicated() const { return replicas_ != nullptr; }
  // The optimizer step of one unit at `lr` over its host state (its gradients then let go: the
  // next step's first store overwrites them).
  void update(int64_t sub, double lr);
  // After a failed step, or one whose gradients were held out of the update (swap_step.h): every
  // unit's step state dropped, device gradients included.
  void end_step();
  // The host gradients of this step (after gradients_stored's reduction), unit by unit.
  std::vector<at::Tensor> final_gradients() override;
  // Between steps: gradients_stored(max_norm), then every unit's update (GradientHolder's).
  UpdateResult apply_written_gradients(double lr, double max_norm) override;
  // The host masters (settled first: no update in flight); parameters_written refreshes the bf16
  // copies the loads carry.
  std::vector<at::Tensor> master_parameters() override;
  void parameters_written() override;
  // The swap step's wait for its updates still running (swap_executor.h: they overlap the next
  // step's forward); the state accessors below call it before reading or writing host state.
  void set_settle(std::function<void()> settle) { settle_ = std::move(settle); }

  // OptimizerOwner (not a ResidentOwner: the swap step, parallel/swap_step.h, runs its backward
  // and its updates through the operations above). gradients(): the host gradients, once every
  // STORE_GRAD of the step ran.
  NamedTensors gradients() override;
  NamedTensors training_state() override;
  void load_training_state(const std::map<std::string, at::Tensor>& tensors, const std::string& source) override;
  StateKind state_kind(const std::string& name) const override;
  void load_parameter(const std::string& name, const at::Tensor& value) override;
  // One unit at a time: loaded, named, evicted. (The state accessors settle the updates first;
  // gradients() does not: it runs on the host stream itself, before the updates.)
  void visit_full_parameters(const std::function<void(const std::vector<std::string>& names)>& fn) override;

 protected:
  // HostHome's jobs, made when the movement is issued and run on its stream:
  std::function<void()> load_job(size_t unit) override;   // materialize the device copy, copy master in
  // Device gradients to the host (added after the step's first), then dropped on the device.
  std::function<void()> store_job(size_t unit) override;
  // Frees the unit's device copy and gradients (after its compute, and its store when it has one).
  void evict(size_t unit) override;

 private:
  struct Entry {
    std::string name;
    at::Tensor param;         // the model's parameter: a view of the unit's device copy
    at::Tensor master, grad;  // views of the unit's host buffers, shaped like the parameter
    int64_t offset = 0, numel = 0;
    bool got_grad = false;    // some micro-batch of this step gave it a gradient
  };
  struct Unit {
    std::vector<Entry> entries;
    at::Tensor master, grad;  // [N] views of the host buffers
    at::Tensor copy;          // [N] bfloat16 view of the copies buffer (bf16 copies), else undefined
    at::Tensor device;        // [N] the device copy
    std::unique_ptr<Optimizer> optimizer;
    bool stored = false;      // this step's gradients started (later stores add)
  };
  Unit& unit(int64_t sub);
  void settle();

  std::vector<Unit> units_;  // the sub-models, then the ends
  std::vector<std::pair<size_t, size_t>> order_;  // (unit, entry) of each parameter, in model order
  c10::Device device_;
  comm::Group* replicas_;
  at::Tensor master_buffer_, grad_buffer_, staging_, copies_;
  CopyLink load_link_, store_link_;
  std::function<void()> settle_;
};

}  // namespace tessera
