// Master weights and the dynamic loss scale for fp16 training (fp16.h).
#include "precision/fp16.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include "core/error.h"

namespace tessera {

MasterWeights::MasterWeights(Named model_params) : model_(std::move(model_params)) {
  at::NoGradGuard no_grad;
  for (const auto& [name, param] : model_) {
    require(param.is_floating_point(), "master weights: parameter ", name, " is not floating point");
    master_.emplace_back(name, param.detach().to(at::kFloat, /*non_blocking=*/false, /*copy=*/true).requires_grad_(true));
  }
}

bool MasterWeights::copy_grads_to_master(double inv_scale) {
  at::NoGradGuard no_grad;
  // The unscale kernel wants one device per call: group the master grads by device.
  std::map<std::string, std::vector<at::Tensor>> by_device;
  for (size_t i = 0; i < model_.size(); ++i) {
    const at::Tensor& g = model_[i].second.grad();
    at::Tensor& master_grad = master_[i].second.mutable_grad();
    if (!g.defined()) {
      master_grad.reset();
      continue;
    }
    master_grad = g.to(at::kFloat, /*non_blocking=*/false, /*copy=*/true);
    by_device[master_grad.device().str()].push_back(master_grad);
  }
  bool found = false;
  for (auto& [device, grads] : by_device) {
    auto options = grads.front().options();
    at::Tensor found_inf = at::zeros({1}, options);
    at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf, at::full({1}, inv_scale, options));
    found = found || found_inf.item<float>() > 0;
  }
  return found;
}

void MasterWeights::copy_master_to_model() {
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < model_.size(); ++i) {
    at::Tensor target = model_[i].second;
    target.copy_(master_[i].second);
  }
}

DynamicLossScaler::DynamicLossScaler(const PrecisionOptions& options, at::Device device)
    : scale_(at::full({1}, options.loss_scale_init, at::TensorOptions(device).dtype(at::kFloat))),
      growth_tracker_(at::zeros({1}, at::TensorOptions(device).dtype(at::kInt))),
      found_inf_(at::zeros({1}, at::TensorOptions(device).dtype(at::kFloat))),
      growth_(options.loss_scale_growth),
      backoff_(options.loss_scale_backoff),
      growth_interval_(options.loss_scale_growth_interval) {}

double DynamicLossScaler::value() const { return scale_.item<double>(); }

int64_t DynamicLossScaler::good_steps() const { return growth_tracker_.item<int64_t>(); }

void DynamicLossScaler::update(bool found_inf) {
  found_inf_.fill_(found_inf ? 1.0 : 0.0);
  at::_amp_update_scale_(scale_, growth_tracker_, found_inf_, growth_, backoff_, growth_interval_);
}

StateKind DynamicLossScaler::state_kind(const std::string& name) {
  return name == "loss_scaler.growth_tracker" ? StateKind::counter : StateKind::real;
}

std::vector<std::pair<std::string, at::Tensor>> DynamicLossScaler::state() const {
  return {{"loss_scaler.scale", scale_}, {"loss_scaler.growth_tracker", growth_tracker_}};
}

void DynamicLossScaler::load_state(const std::map<std::string, at::Tensor>& state, const std::string& source) {
  for (const auto& [name, tensor] : this->state()) {
    auto it = state.find(name);
    require(it != state.end(), source, ": loss scaler state ", name, " is missing");
    require(it->second.numel() == 1, source, ": loss scaler state ", name, " must hold one value (got shape ",
            it->second.sizes(), ")");
  }
  require(state.size() == 2, source, ": loss scaler state has ", state.size(),
          " entries, expected loss_scaler.scale and loss_scaler.growth_tracker");
  scale_.copy_(state.at("loss_scaler.scale").reshape({1}));
  growth_tracker_.copy_(state.at("loss_scaler.growth_tracker").reshape({1}));
}

}  // namespace tessera
