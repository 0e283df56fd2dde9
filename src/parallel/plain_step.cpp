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

void PlainStep::choose_activation_codecs(const Batch& batch) {
  AdaptiveCodecs& codecs = *model_->adaptive_activation_codecs();
  comm::Group* replicas = probing_.replicas;
  const bool root = replicas == nullptr || replicas->rank() == 0;
  const std::vector<int64_t>& layers = model_->layers();
  if (root) {
    const double scale = owner_.loss_scale();
    const ActivationProbe probe = probe_activation_codecs(
        model_, codecs, [&] { return forward(batch).loss.to(at::kFloat) * scale; },
        [&](Block& block, const at::Tensor& x) {
          AutocastGuard guard(device_.type(), autocast_.value_or(at::kFloat), autocast_.has_value());
          return block->forward(x).x;
        },
        ProbeReduction{&probing_.norm, &probing_.shares, probing_.input_weight, probing_.sequence});
    note_ = describe_activation_codecs(probe.slots, probe.codecs, codecs.bits(), probe.seconds);
  }
  if (replicas == nullptr || replicas->size() == 1) return;
  // The table by layer: each block's count of slots, then every slot's codec.
  at::Tensor counts = at::zeros({static_cast<int64_t>(layers.size())}, at::kLong);
  std::vector<int64_t> flat;
  if (root)
    for (size_t i = 0; i < layers.size(); ++i) {
      const auto it = codecs.table().find(layers[i]);
      if (it == codecs.table().end()) continue;
      counts[static_cast<int64_t>(i)] = static_cast<int64_t>(it->second.size());
      for (ActivationCodec c : it->second) flat.push_back(static_cast<int64_t>(c));
    }
  counts = comm::to_device_queued(counts, device_);
  replicas->broadcast(counts, 0);
  counts = counts.cpu();
  if (counts.sum().item<int64_t>() == 0) return;  // no block saves a slot (nothing to broadcast)
  at::Tensor codes = root ? at::tensor(flat, at::kLong) : at::zeros({counts.sum().item<int64_t>()}, at::kLong);
  codes = comm::to_device_queued(codes, device_);
  replicas->broadcast(codes, 0);
  if (root) return;
  codes = codes.cpu();
  SlotCodecs table;
  int64_t at = 0;
  for (size_t i = 0; i < layers.size(); ++i)
    for (int64_t k = 0; k < counts[static_cast<int64_t>(i)].item<int64_t>(); ++k)
      table[layers[i]].push_back(static_cast<ActivationCodec>(codes[at++].item<int64_t>()));
  codecs.apply(std::move(table));
}

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
  if (model_->adaptive_activation_codecs() &&
      (steps_run_ == 0 || (probing_.every > 0 && steps_run_ % probing_.every == 0)))
    choose_activation_codecs(micro_batches.front());
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
