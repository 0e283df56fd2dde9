// AdamW: fused (at::_fused_adamw_) and per-tensor implementations of the update in adamw.h.
#include "optim/adamw.h"

#include <cmath>
#include <tuple>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include "core/error.h"

namespace tessera {

AdamW::AdamW(const OptimOptions& options, NamedParams named_params, std::vector<bool> decay)
    : beta1_(options.beta1),
      beta2_(options.beta2),
      eps_(options.eps),
      weight_decay_(options.weight_decay),
      fused_(options.fused) {
  at::NoGradGuard no_grad;
  require(decay.empty() || decay.size() == named_params.size(), "internal: AdamW got ", decay.size(),
          " weight-decay flags for ", named_params.size(), " parameters");
  for (size_t i = 0; i < named_params.size(); ++i) {
    const auto& [name, param] = named_params[i];
    require(param.is_floating_point(), "optimizer: parameter ", name, " is not floating point");
    slots_.push_back({name, param, at::zeros_like(param, at::MemoryFormat::Contiguous),
                      at::zeros_like(param, at::MemoryFormat::Contiguous),
                      at::zeros({}, param.options().dtype(at::kFloat)), decay.empty() ? decays(param) : decay[i]});
  }
}

void AdamW::step(double lr) {
  at::NoGradGuard no_grad;
  if (fused_) step_fused(lr);
  else step_unfused(lr);
}

void AdamW::step_fused(double lr) {
  struct Group {
    std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs, steps;
  };
  // Key: (device, dtype, decays); the kernel needs one device and dtype per call.
  std::map<std::tuple<std::string, at::ScalarType, bool>, Group> groups;
  for (auto& s : slots_) {
    const at::Tensor& grad = s.param.grad();
    if (!grad.defined()) continue;
    Group& g = groups[{s.param.device().str(), s.param.scalar_type(), s.decay}];
    g.params.push_back(s.param);
    g.grads.push_back(grad);
    g.exp_avgs.push_back(s.exp_avg);
    g.exp_avg_sqs.push_back(s.exp_avg_sq);
    g.steps.push_back(s.step);
  }
  for (auto& [key, g] : groups) {
    const double wd = std::get<2>(key) ? weight_decay_ : 0.0;
    at::_foreach_add_(g.steps, 1);
    at::_fused_adamw_(g.params, g.grads, g.exp_avgs, g.exp_avg_sqs, /*max_exp_avg_sqs=*/{}, g.steps, lr, beta1_,
                      beta2_, wd, eps_, /*amsgrad=*/false, /*maximize=*/false);
  }
}

void AdamW::step_unfused(double lr) {
  for (auto& s : slots_) {
    const at::Tensor& grad = s.param.grad();
    if (!grad.defined()) continue;
    s.step.add_(1);
    const double t = s.step.item<double>();
    if (s.decay && weight_decay_ != 0) s.param.mul_(1 - lr * weight_decay_);
    s.exp_avg.lerp_(grad, 1 - beta1_);
    s.exp_avg_sq.mul_(beta2_).addcmul_(grad, grad, 1 - beta2_);
    const double step_size = lr / (1 - std::pow(beta1_, t));
    const double bias_correction2_sqrt = std::pow(1 - std::pow(beta2_, t), 0.5);
    at::Tensor denom = (s.exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps_);
    s.param.addcdiv_(s.exp_avg, denom, -step_size);
  }
}

NamedParams AdamW::state() const {
  NamedParams out;
  for (const auto& s : slots_) {
    out.emplace_back(s.name + ".exp_avg", s.exp_avg);
    out.emplace_back(s.name + ".exp_avg_sq", s.exp_avg_sq);
    out.emplace_back(s.name + ".step", s.step);
  }
  return out;
}

void AdamW::load_state(const std::map<std::string, at::Tensor>& state, const std::string& source) {
  load_named_state(this->state(), state, source);
}

StateKind AdamW::slot_kind(const std::string& slot) const {
  return slot == "exp_avg_sq" ? StateKind::non_negative : StateKind::real;
}

void AdamW::zero_grad() {
  for (auto& s : slots_) s.param.mutable_grad().reset();
}

}  // namespace tessera
