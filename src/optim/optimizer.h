// The optimizer interface shared by AdamW (adamw.h), Adafactor (adafactor.h) and SGD (sgd.h), and
// the factory that picks one from OptimOptions.
//
// Invariants:
// - An optimizer owns state for exactly the parameters it was built with, created eagerly (zeros,
//   step 0), so state() always lists the same names and shapes.
// - step() updates the parameters that have a defined grad(); the others are untouched and their
//   step counters do not advance (each parameter counts its own steps, as torch.optim does).
// - state() returns the live state tensors named "<param name>.<slot>" (slots: exp_avg,
//   exp_avg_sq, step for AdamW; exp_avg_sq_row, exp_avg_sq_col or exp_avg_sq, exp_avg, step for
//   Adafactor; momentum_buffer, step for SGD with momentum, nothing without). Copy them (a
//   checkpoint writer does) before stepping again if a snapshot is needed.
//   load_state(state()) followed by step() is bit-identical to never having saved.
// - load_state() refuses missing, extra and shape-mismatched entries, naming `source` and the
//   tensor, and changes nothing when it refuses.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "core/state_kind.h"
#include "optim/optim_options.h"

namespace tessera {

// (name, tensor) pairs in a fixed order: the same type as NamedTensors of checkpoint/safetensors.h,
// declared here because the optim library does not link the checkpoint library.
using NamedParams = std::vector<std::pair<std::string, at::Tensor>>;

// The parameter a state entry "<param name>.<slot>" of state() belongs to ("<param name>"): the one
// place that reads the naming above; "" for a name without a slot.
std::string parameter_of_state(const std::string& state_name);

class Optimizer {
 public:
  virtual ~Optimizer();
  // One update with learning rate `lr` (Adafactor with relative_step ignores it).
  virtual void step(double lr) = 0;
  virtual NamedParams state() const = 0;
  virtual void load_state(const std::map<std::string, at::Tensor>& state, const std::string& source) = 0;
  // What the state entry `state_name` ("<param name>.<slot>") holds (core/state_kind.h): every
  // optimizer's "step" is a counter; the others' kinds are the optimizer's own (slot_kind).
  StateKind state_kind(const std::string& state_name) const;
  // Drops every parameter's grad (set to undefined, as torch's zero_grad(set_to_none=True)).
  virtual void zero_grad() = 0;

 protected:
  // The kind of a slot other than "step"; the default: real.
  virtual StateKind slot_kind(const std::string& slot) const;
};

// AdamW, Adafactor or SGD per options.name. Weight decay applies to parameters with dim() >= 2,
// or, when `decay` is given (AdamW and SGD; one flag per parameter), to those flagged: an
// optimizer over 1-D slices of a sharded flat buffer decays the slices of matrices (parallel/data).
std::unique_ptr<Optimizer> make_optimizer(const OptimOptions& options, NamedParams named_params,
                                          std::vector<bool> decay = {});

// The per-parameter state of an optimizer that updates each element on its own, so that ZeRO can
// shard it like the parameters (parallel/data): the slots shaped like the parameter (AdamW:
// exp_avg, exp_avg_sq; SGD with momentum: momentum_buffer; plain SGD: none) and whether each
// parameter also has a scalar "step". Adafactor factors its state over whole rows and columns:
// not elementwise (shardable() false).
struct ElementwiseState {
  bool shardable = true;
  std::vector<std::string> slots;
  bool step = false;
};
ElementwiseState elementwise_state(const OptimOptions& options);

// Shared by the optimizers' load_state(): checks that `given` holds exactly the names of `live`
// with the same shapes, then copies each into its live tensor (converting device and dtype).
void load_named_state(const NamedParams& live, const std::map<std::string, at::Tensor>& given,
                      const std::string& source);

// Whether weight decay applies to a parameter: matrices and higher, not biases or norm weights.
inline bool decays(const at::Tensor& param) { return param.dim() >= 2; }

}  // namespace tessera
