// The plain step runner (plain_step.h).
#include "parallel/plain_step.h"

#include <torch/utils.h>

#include "comm/device.h"
#include "core/fault_injection.h"
#include "precision/autocast.h"

namespace tessera {

PlainStep::PlainStep(TransformerLM model, ResidentOwner& owner, c10::Device device,
                     std::optional<at::ScalarType> autocast, double grad_clip, ActivationProbing probing)
    : model_(std::move(model)),
      owner_(owner),
      device_(device),
      autocast_(autocast),
      grad_clip_(grad_clip),
      probing_(std::move(probing)) {}

std::optional<std::string> PlainStep::take_note() {
  std::optional<std::string> out = std::move(note_);
  note_.reset();
  return out;
}

ModelOutput PlainStep::forward(const Batch& batch) {
  AutocastGuard guard(device_.type(), autocast_.value_or(at::kFloat), autocast_.has_value());
  return model_->forward(comm::to_device_queued(batch.inputs, device_), comm::to_device_queued(batch.targets, device_));
}

StepLosses PlainStep::run(const std::vector<Batch>& micro_batches, double lr, const GradientsReady& gradients_ready) {
  model_->train();
  if (model_->adaptive_activation_codecs() && probes_before(probing_, steps_run_)) {
    // Under ZeRO-3 every replica probes (its gathers are collectives of the replicas), as the ep
    // group does under expert parallelism: each on the micro-batch of its group's rank 0.
    ActivationProbing probing = probing_;
    comm::Group* sharing = probing.experts;
    if (owner_.probes_on_every_replica()) {
      sharing = probing.replicas;
      probing.replicas = nullptr;
    }
    Batch batch = micro_batches.front();
    const bool probes = probing.replicas == nullptr || probing.replicas->rank() == 0;
    if (sharing && probes)
      for (at::Tensor* t : {&batch.inputs, &batch.targets}) {
        *t = comm::to_device_queued(*t, device_).clone();  // the step's own batch stays as it is
        sharing->broadcast(*t, 0);
      }
    const double scale = owner_.loss_scale();
    owner_.run_probe([&](const ResidentOwner::AroundBlock& around_block) {
      probing.around_block = around_block;
      note_ = choose_activation_codecs(model_, probing, device_, autocast_, [&] {
        census_backward(model_, forward(batch).loss.to(at::kFloat) * scale);
      });
    });
  }
  ++steps_run_;
  const double n = static_cast<double>(micro_batches.size());
  // cross-entropy, auxiliary: summed where they are computed, read by the caller once
  at::Tensor sums = at::zeros({2}, at::TensorOptions().dtype(at::kDouble).device(device_));
  for (size_t m = 0; m < micro_batches.size(); ++m) {
    fault::point("forward");
    at::Tensor loss, ce_and_aux;
    {
      // The output's logits go before the backward: the loss's graph keeps what its backward needs
      // (on the CPU the log-probabilities), so holding them would keep a [tokens, V] tensor through
      // the whole backward, as the pipeline's and swap's steps do not.
      const ModelOutput out = forward(micro_batches[m]);
      loss = out.loss.to(at::kFloat) / n;
      ce_and_aux = at::stack({out.ce_loss.detach(), out.aux_loss.detach()});
    }
    const double scale = owner_.loss_scale();
    if (scale != 1.0) loss = loss * scale;
    owner_.before_backward(m + 1 == micro_batches.size());
    fault::point("backward");
    loss.backward();
    sums += ce_and_aux.to(at::kDouble);
  }
  owner_.finish_gradients();
  StepLosses losses;
  if (!gradients_ready || gradients_ready()) {
    fault::point("optimizer");
    losses.update = owner_.apply(lr, grad_clip_);
  } else {
    owner_.drop_gradients();
    losses.update.applied = false;
  }
  losses.ce_sum = sums[0];
  losses.aux_sum = sums[1];
  return losses;
}

double PlainStep::evaluate(const std::vector<Batch>& batches) {
  torch::NoGradGuard no_grad;
  model_->eval();
  at::Tensor total = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(device_));
  for (const Batch& batch : batches) total += forward(batch).ce_loss.detach().to(at::kDouble);
  model_->train();
  return total.item<double>() / static_cast<double>(batches.size());
}

}  // namespace tessera
