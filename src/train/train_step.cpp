#include "train/train_step.h"

#include <ATen/ATen.h>
#include <torch/torch.h>

#include "core/error.h"
#include "optim/clipping.h"
#include "precision/autocast.h"

namespace tessera {
namespace {

void append_prefixed(NamedTensors& out, const std::string& prefix, const NamedTensors& in) {
  for (const auto& [name, t] : in) out.emplace_back(prefix + name, t);
}

std::map<std::string, at::Tensor> with_prefix(const std::map<std::string, at::Tensor>& all, const std::string& prefix) {
  std::map<std::string, at::Tensor> out;
  for (const auto& [name, t] : all)
    if (name.rfind(prefix, 0) == 0) out.emplace(name.substr(prefix.size()), t);
  return out;
}

c10::Device training_device(const std::string& name) {
  c10::Device device(name);
  if (device.is_cuda() && !torch::cuda::is_available())
    fail("train.device = \"", name, "\" but no CUDA device is available",
#ifdef TESSERA_WITH_CUDA
         ""
#else
         " (this build has TESSERA_CUDA=OFF)"
#endif
    );
  return device;
}

}  // namespace

TrainStep::TrainStep(const Config& config)
    : config_(config), device_(training_device(config.train.device)), autocast_(autocast_dtype(config.precision)) {
  if (config.train.threads > 0) at::set_num_threads(static_cast<int>(config.train.threads));
  torch::manual_seed(static_cast<uint64_t>(config.train.seed));
  model_ = TransformerLM(config.model);
  model_->set_activation_checkpointing(config.memory.activation_checkpointing);
  model_->to(device_, parameter_dtype(config.precision));
  NamedTensors named;
  for (const auto& item : model_->named_parameters()) named.emplace_back(item.key(), item.value());
  if (config.precision.dtype == "fp16") {
    master_ = std::make_unique<MasterWeights>(named);
    scaler_ = std::make_unique<DynamicLossScaler>(config.precision, device_);
    optimizer_ = make_optimizer(config.optim, master_->master());
  } else {
    optimizer_ = make_optimizer(config.optim, named);
  }
}

c10::ScalarType TrainStep::compute_dtype() const { return master_ ? at::kHalf : autocast_.value_or(at::kFloat); }

std::vector<at::Tensor> TrainStep::optimized_parameters() const {
  std::vector<at::Tensor> out;
  if (master_)
    for (const auto& [name, p] : master_->master()) out.push_back(p);
  else
    for (const auto& p : model_->parameters()) out.push_back(p);
  return out;
}

StepResult TrainStep::run(const std::vector<Batch>& micro_batches, double lr) {
  StepResult result;
  model_->train();
  const double n = static_cast<double>(micro_batches.size());
  at::Tensor ce_sum = at::zeros({}, at::kDouble), aux_sum = at::zeros({}, at::kDouble);
  for (const Batch& batch : micro_batches) {
    ModelOutput out;
    {
      AutocastGuard guard(device_.type(), autocast_.value_or(at::kFloat), autocast_.has_value());
      out = model_->forward(batch.inputs.to(device_), batch.targets.to(device_));
    }
    at::Tensor loss = out.loss.to(at::kFloat) / n;
    if (scaler_) loss = loss * scaler_->value();
    loss.backward();
    ce_sum += out.ce_loss.detach().to(at::kCPU, at::kDouble);
    aux_sum += out.aux_loss.detach().to(at::kCPU, at::kDouble);
  }
  result.ce_loss = ce_sum.item<double>() / n;
  result.aux_loss = aux_sum.item<double>() / n;

  if (master_) {
    result.skipped = master_->copy_grads_to_master(1.0 / scaler_->value());
    if (!result.skipped) {
      result.grad_norm = clip_grad_norm(optimized_parameters(), config_.optim.grad_clip);
      optimizer_->step(lr);
      master_->copy_master_to_model();
    }
    scaler_->update(result.skipped);
  } else {
    result.grad_norm = clip_grad_norm(optimized_parameters(), config_.optim.grad_clip);
    optimizer_->step(lr);
  }
  optimizer_->zero_grad();
  for (auto& p : model_->parameters()) p.mutable_grad().reset();
  return result;
}

double TrainStep::evaluate(const std::vector<Batch>& batches) {
  torch::NoGradGuard no_grad;
  model_->eval();
  double total = 0;
  for (const Batch& batch : batches) {
    AutocastGuard guard(device_.type(), autocast_.value_or(at::kFloat), autocast_.has_value());
    total += model_->forward(batch.inputs.to(device_), batch.targets.to(device_)).ce_loss.item<double>();
  }
  model_->train();
  return total / static_cast<double>(batches.size());
}

NamedTensors TrainStep::training_state() const {
  NamedTensors out;
  if (master_) append_prefixed(out, "master.", master_->master());
  append_prefixed(out, "optim.", optimizer_->state());
  if (scaler_) append_prefixed(out, "scaler.", scaler_->state());
  return out;
}

void TrainStep::load_training_state(const std::map<std::string, at::Tensor>& tensors, const std::string& source) {
  if (master_) load_named_state(master_->master(), with_prefix(tensors, "master."), source);
  optimizer_->load_state(with_prefix(tensors, "optim."), source);
  if (scaler_) scaler_->load_state(with_prefix(tensors, "scaler."), source);
}

}  // namespace tessera
