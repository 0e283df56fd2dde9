// SGD with momentum and L2 weight decay: the update in sgd.h, per tensor.
#include "optim/sgd.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include "core/error.h"

namespace tessera {

SGD::SGD(const OptimOptions& options, NamedParams named_params, std::vector<bool> decay)
    : momentum_(options.momentum), weight_decay_(options.weight_decay), nesterov_(options.nesterov) {
  at::NoGradGuard no_grad;
  require(decay.empty() || decay.size() == named_params.size(), "internal: SGD got ", decay.size(),
          " weight-decay flags for ", named_params.size(), " parameters");
  for (size_t i = 0; i < named_params.size(); ++i) {
    const auto& [name, param] = named_params[i];
    require(param.is_floating_point(), "optimizer: parameter ", name, " is not floating point");
    Slot s{name, param, {}, {}, decay.empty() ? decays(param) : decay[i]};
    if (momentum_ != 0) {
      s.momentum_buffer = at::zeros_like(param, at::MemoryFormat::Contiguous);
      s.step = at::zeros({}, param.options().dtype(at::kFloat));
    }
    slots_.push_back(std::move(s));
  }
}

void SGD::step(double lr) {
  at::NoGradGuard no_grad;
  for (Slot& s : slots_) {
    const at::Tensor& grad = s.param.grad();
    if (!grad.defined()) continue;
    at::Tensor d = s.decay && weight_decay_ != 0 ? grad.add(s.param, weight_decay_) : grad;
    if (momentum_ != 0) {
      if (s.step.item<double>() == 0) s.momentum_buffer.copy_(d);
      else s.momentum_buffer.mul_(momentum_).add_(d);
      s.step.add_(1);
      d = nesterov_ ? d.add(s.momentum_buffer, momentum_) : s.momentum_buffer;
    }
    s.param.add_(d, -lr);
  }
}

NamedParams SGD::state() const {
  NamedParams out;
  if (momentum_ == 0) return out;
  for (const Slot& s : slots_) {
    out.emplace_back(s.name + ".momentum_buffer", s.momentum_buffer);
    out.emplace_back(s.name + ".step", s.step);
  }
  return out;
}

void SGD::load_state(const std::map<std::string, at::Tensor>& state, const std::string& source) {
  load_named_state(this->state(), state, source);
}

void SGD::zero_grad() {
  for (Slot& s : slots_) s.param.mutable_grad().reset();
}

}  // namespace tessera
