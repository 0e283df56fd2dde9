// The owner of a model's optimizer without data parallelism (local_optimizer.h).
#include "parallel/local_optimizer.h"

#include <ATen/ATen.h>

#include "core/flat_tensors.h"

namespace tessera {

LocalOptimizer::LocalOptimizer(const NamedParams& params, const OptimOptions& optim, const PrecisionOptions& precision,
                               c10::Device device, ModelParallelNorm norm, GradientShares shares)
    : params_(params), norm_(std::move(norm)), shares_(std::move(shares)) {
  if (precision.dtype == "fp16") {
    master_ = std::make_unique<MasterWeights>(params_);
    scaler_ = std::make_unique<DynamicLossScaler>(precision, device);
    optimizer_ = make_optimizer(optim, master_->master());
  } else {
    optimizer_ = make_optimizer(optim, params_);
  }
}

double LocalOptimizer::loss_scale() const { return scaler_ ? scaler_->value() : 1.0; }

// The norm of the gradients the optimizer reads (the masters' under fp16), clipped in place; on one
// process it stays on the device, unread.
at::Tensor LocalOptimizer::clip(double max_norm) {
  const NamedParams& optimized = master_ ? master_->master() : params_;
  std::vector<at::Tensor> grads;
  if (!norm_.split()) {
    for (const auto& [name, p] : optimized)
      if (p.grad().defined()) grads.push_back(p.grad());
    return clip_gradients_queued(grads, max_norm);
  }
  at::NoGradGuard no_grad;
  const double norm = norm_.grad_norm(optimized, grads);
  scale_to_max_norm(grads, norm, max_norm);
  return at::scalar_tensor(norm, at::kDouble);
}

void LocalOptimizer::finish_gradients() {
  if (shares_.any()) {
    std::vector<std::pair<std::string, at::Tensor>> shares;
    for (const auto& [name, p] : params_)
      if (shares_.holds(name) && p.grad().defined()) shares.emplace_back(name, p.grad());
    shares_.sum(shares);
  }
  overflow_ = backward_overflow_ = master_ && master_->copy_grads_to_master(1.0 / scaler_->value());
}

NamedTensors LocalOptimizer::gradients() {
  NamedTensors out;
  for (const auto& [name, p] : master_ ? master_->master() : params_)
    out.emplace_back(name, p.grad().defined() ? p.grad().clone() : at::Tensor());
  return out;
}

void LocalOptimizer::sum_gradient_over(const std::string& name, comm::Group& copies) {
  require(!master_, "internal: summing a tied gradient over copies with fp16 master weights");
  at::NoGradGuard no_grad;
  for (auto& [n, p] : params_)
    if (n == name) {
      at::Tensor& g = p.mutable_grad();
      if (!g.defined()) g = at::zeros_like(p);
      return copies.all_reduce(g);
    }
  fail("internal: LocalOptimizer has no parameter '", name, "'");
}

UpdateResult LocalOptimizer::apply(double lr, double max_norm) {
  UpdateResult result;
  if (master_) {
    result.skipped = overflow_;
    if (!result.skipped) {
      result.grad_norm = clip(max_norm);
      optimizer_->step(lr);
      master_->copy_master_to_model();
    }
    scaler_->update(backward_overflow_);
  } else {
    result.grad_norm = clip(max_norm);
    optimizer_->step(lr);
  }
  optimizer_->zero_grad();
  for (auto& [name, p] : params_) p.mutable_grad().reset();
  return result;
}

void LocalOptimizer::drop_gradients() {
  if (scaler_) scaler_->update(backward_overflow_);
  optimizer_->zero_grad();
  for (auto& [name, p] : params_) p.mutable_grad().reset();
}

std::vector<at::Tensor> LocalOptimizer::final_gradients() {
  std::vector<at::Tensor> out;
  for (const auto& [name, p] : master_ ? master_->master() : params_) {
    at::Tensor& g = const_cast<at::Tensor&>(p).mutable_grad();
    if (!g.defined()) g = at::zeros_like(p);
    out.push_back(g);
  }
  return out;
}

std::vector<at::Tensor> LocalOptimizer::gradient_leaves() {
  std::vector<at::Tensor> out;
  if (!master_)
    for (const auto& [name, p] : params_) out.push_back(p);
  return out;
}

void LocalOptimizer::gradients_written() {
  if (!master_) return;
  std::vector<at::Tensor> grads;
  for (const auto& [name, p] : master_->master())
    if (p.grad().defined()) grads.push_back(p.grad());
  overflow_ = !all_finite(grads);
}

UpdateResult LocalOptimizer::apply_written_gradients(double lr, double max_norm) {
  gradients_written();
  backward_overflow_ = overflow_;  // no backward of its own: the scale follows the written gradients
  return apply(lr, max_norm);
}

std::vector<at::Tensor> LocalOptimizer::master_parameters() {
  std::vector<at::Tensor> out;
  for (const auto& [name, p] : master_ ? master_->master() : params_) out.push_back(p);
  return out;
}

void LocalOptimizer::parameters_written() {
  if (master_) master_->copy_master_to_model();
}

NamedTensors LocalOptimizer::training_state() {
  NamedTensors out;
  auto append = [&](const std::string& prefix, const NamedParams& in) {
    for (const auto& [name, t] : in) out.emplace_back(prefix + name, t);
  };
  if (master_) append("master.", master_->master());
  append("optim.", optimizer_->state());
  if (scaler_) append("scaler.", scaler_->state());
  return out;
}

void LocalOptimizer::load_training_state(const std::map<std::string, at::Tensor>& tensors, const std::string& source) {
  if (master_) load_named_state(master_->master(), with_prefix(tensors, "master."), source);
  optimizer_->load_state(with_prefix(tensors, "optim."), source);
  if (scaler_) scaler_->load_state(with_prefix(tensors, "scaler."), source);
}

StateKind LocalOptimizer::state_kind(const std::string& name) const { return owned_state_kind(*optimizer_, name); }

void LocalOptimizer::load_parameter(const std::string& name, const at::Tensor& value) {
  at::NoGradGuard no_grad;
  for (auto& [n, p] : params_)
    if (n == name) return void(p.copy_(value));
  fail("internal: LocalOptimizer has no parameter '", name, "'");
}

void LocalOptimizer::visit_full_parameters(const std::function<void(const std::vector<std::string>& names)>& fn) {
  std::vector<std::string> names;
  for (const auto& [name, p] : params_) names.push_back(name);
  fn(names);
}

}  // namespace tessera
