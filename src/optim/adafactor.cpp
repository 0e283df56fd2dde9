// Adafactor: the update of adafactor.h, one parameter at a time.
#include "optim/adafactor.h"

#include <algorithm>
#include <cmath>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include "core/error.h"

namespace tessera {

namespace {

at::Tensor rms(const at::Tensor& x) { return x.norm() / std::sqrt(static_cast<double>(x.numel())); }

}  // namespace

Adafactor::Adafactor(const OptimOptions& options, NamedParams named_params) : options_(options) {
  at::NoGradGuard no_grad;
  for (auto& [name, param] : named_params) {
    require(param.is_floating_point(), "optimizer: parameter ", name, " is not floating point");
    const auto f32 = param.options().dtype(at::kFloat);
    Slot s{name, param, {}, {}, {}, {}, at::zeros({}, at::kFloat)};
    if (param.dim() >= 2) {
      auto sizes = param.sizes().vec();
      auto row = sizes, col = sizes;
      row.erase(row.end() - 1);
      col.erase(col.end() - 2);
      s.row = at::zeros(row, f32);
      s.col = at::zeros(col, f32);
    } else {
      s.second = at::zeros(param.sizes(), f32);
    }
    if (options.adafactor_beta1 > 0) s.first = at::zeros(param.sizes(), f32);
    slots_.push_back(std::move(s));
  }
}

void Adafactor::step(double lr) {
  at::NoGradGuard no_grad;
  for (auto& s : slots_)
    if (s.param.grad().defined()) update(s, lr);
}

void Adafactor::update(Slot& s, double lr) {
  const OptimOptions& o = options_;
  const at::Tensor grad = s.param.grad().to(at::kFloat);
  const bool low_precision = s.param.scalar_type() != at::kFloat;
  at::Tensor p = low_precision ? s.param.to(at::kFloat) : s.param;

  s.step.add_(1);
  const double t = s.step.item<double>();
  const double rho = o.adafactor_relative_step ? std::min(1e-2, 1.0 / std::sqrt(t)) : lr;
  at::Tensor alpha = o.adafactor_scale_parameter ? rms(p).clamp_min(o.adafactor_eps2) * rho
                                                 : at::scalar_tensor(rho, p.options());
  const double beta2t = 1.0 - std::pow(t, o.adafactor_decay_rate);

  at::Tensor u = grad * grad + o.adafactor_eps1;
  if (s.row.defined()) {
    s.row.mul_(beta2t).add_(u.mean(-1), 1.0 - beta2t);
    s.col.mul_(beta2t).add_(u.mean(-2), 1.0 - beta2t);
    at::Tensor r = (s.row / s.row.mean(-1, /*keepdim=*/true)).rsqrt_().unsqueeze(-1);  // [..., n, 1]
    at::Tensor c = s.col.unsqueeze(-2).rsqrt();                                          // [..., 1, m]
    u = (r * c).mul_(grad);
  } else {
    s.second.mul_(beta2t).add_(u, 1.0 - beta2t);
    u = s.second.rsqrt().mul_(grad);
  }
  u.div_((rms(u) / o.adafactor_clip_threshold).clamp_(1.0));
  u.mul_(alpha);
  if (s.first.defined()) {
    s.first.mul_(o.adafactor_beta1).add_(u, 1.0 - o.adafactor_beta1);
    u = s.first;
  }
  if (decays(s.param) && o.weight_decay != 0) p.add_(p * (alpha * -o.weight_decay));
  p.sub_(u);
  if (low_precision) s.param.copy_(p);
}

NamedParams Adafactor::state() const {
  NamedParams out;
  for (const auto& s : slots_) {
    if (s.row.defined()) {
      out.emplace_back(s.name + ".exp_avg_sq_row", s.row);
      out.emplace_back(s.name + ".exp_avg_sq_col", s.col);
    } else {
      out.emplace_back(s.name + ".exp_avg_sq", s.second);
    }
    if (s.first.defined()) out.emplace_back(s.name + ".exp_avg", s.first);
    out.emplace_back(s.name + ".step", s.step);
  }
  return out;
}

void Adafactor::load_state(const std::map<std::string, at::Tensor>& state, const std::string& source) {
  load_named_state(this->state(), state, source);
}

StateKind Adafactor::slot_kind(const std::string& slot) const {
  return slot.rfind("exp_avg_sq", 0) == 0 ? StateKind::non_negative : StateKind::real;
}

void Adafactor::zero_grad() {
  for (auto& s : slots_) s.param.mutable_grad().reset();
}

}  // namespace tessera
