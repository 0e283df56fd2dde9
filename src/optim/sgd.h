// SGD with momentum (heavy-ball or Nesterov) and L2 weight decay, the formula of torch.optim.SGD
// (dampening 0), for a parameter p with gradient g:
//
//   g  = g + wd * p                         (only parameters with dim() >= 2, or those flagged)
//   t == 0:  buf = g                         (torch creates the buffer from the first gradient)
//   t >  0:  buf = momentum * buf + g
//   d  = nesterov ? g + momentum * buf : buf (momentum = 0: d = g, no buffer)
//   p -= lr * d;  t += 1
//
// Unlike AdamW its update is proportional to the gradient, so a run under SGD shows a constant
// gradient-scale error (a factor 2 from a wrong reduction) that AdamW's normalisation hides: the
// equivalence harness runs rows with it. It is also the outer optimizer of DiLoCo (Nesterov).
//
// State per parameter, created eagerly when momentum > 0: momentum_buffer (dtype and device of p)
// and step (float32 scalar: how many updates this parameter has had, so a resumed run takes the
// t > 0 branch exactly as the uninterrupted one). With momentum = 0 the optimizer has no state.
// Weight decay follows `decay` (one flag per parameter) when given, else decays(p).
#pragma once

#include <map>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "optim/optimizer.h"

namespace tessera {

class SGD final : public Optimizer {
 public:
  SGD(const OptimOptions& options, NamedParams named_params, std::vector<bool> decay = {});

  void step(double lr) override;
  NamedParams state() const override;
  void load_state(const std::map<std::string, at::Tensor>& state, const std::string& source) override;
  void zero_grad() override;

 private:
  struct Slot {
    std::string name;
    at::Tensor param, momentum_buffer, step;  // the last two undefined when momentum = 0
    bool decay;
  };

  double momentum_, weight_decay_;
  bool nesterov_;
  std::vector<Slot> slots_;
};

}  // namespace tessera
