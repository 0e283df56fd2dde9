// A training step of a swapped model (swap_step.h).
#include "parallel/swap_step.h"

#include <atomic>
#include <memory>

#include <cstdio>

#include <torch/autograd.h>
#include <torch/utils.h>

#include "core/error.h"
#include "core/fault_injection.h"
#include "core/fs.h"
#include "memory/swap/swap_simulate.h"
#include "memory/swap/swap_timeline.h"
#include "precision/autocast.h"

namespace tessera {


SwapStep::SwapStep(TransformerLM model, SwapOwner& owner, const SwapStepOptions& options, c10::Device device,
                   std::optional<at::ScalarType> autocast, swap::SwapPlan plan)
    : model_(std::move(model)),
      owner_(owner),
      options_(options),
      device_(device),
      autocast_(autocast),
      plan_(swap::build_swap_plan(std::move(plan))),
      executor_(owner) {
  swap::validate_swap_plan(plan_);
  owner_.set_settle([this] { executor_.settle(); });
}

SwapStep::~SwapStep() { owner_.set_settle({}); }

const std::vector<swap::TimedAction>& SwapStep::timeline() {
  executor_.settle();
  return *timeline_;
}

void SwapStep::compute(const swap::Action& a, const std::vector<Batch>& batches) {
  const Batch& batch = batches[static_cast<size_t>(a.micro)];
  const swap::SubModel& sub = plan_.sub(a.sub);
  fault::point(a.op == swap::Op::ComputeF ? "forward" : "backward");
  const bool first = a.sub == 0, last = a.sub + 1 == plan_.size();
  const double micro_batches = static_cast<double>(plan_.micro_batches);
  Stash& s = stash_[a.sub];
  if (a.op == swap::Op::ComputeF) {
    AutocastGuard guard(device_.type(), autocast_.value_or(at::kFloat), autocast_.has_value());
    at::Tensor x;
    if (first) {
      x = model_->embed(batch.inputs.to(device_));
    } else {
      Stash& before = stash_.at(a.sub - 1);
      s.input = before.output.detach().requires_grad_(true);
      x = s.input;
    }
    const BlockOutput blocks = model_->run_blocks(x, sub.first, sub.end);
    if (!last) {
      s.output = blocks.x;
      if (blocks.aux_loss.requires_grad()) {  // mixture-of-experts blocks: their own loss term
        s.aux = blocks.aux_loss / micro_batches;
        aux_sum_ += blocks.aux_loss.detach().to(at::kCPU, at::kDouble);
      }
      return;
    }
    const ModelOutput out = model_->head(blocks.x, batch.targets.to(device_), blocks.aux_loss);
    s.output = out.loss.to(at::kFloat) / micro_batches;
    ce_sum_ += out.ce_loss.detach().to(at::kCPU, at::kDouble);
    aux_sum_ += out.aux_loss.detach().to(at::kCPU, at::kDouble);
    return;
  }
  std::vector<at::Tensor> roots{s.output}, grads{s.grad_out.defined() ? s.grad_out : at::ones_like(s.output)};
  if (s.aux.defined()) {
    roots.push_back(s.aux);
    grads.push_back(at::ones_like(s.aux));
  }
  torch::autograd::backward(roots, grads);
  if (!first) stash_.at(a.sub - 1).grad_out = s.input.grad();
  stash_.erase(a.sub);
}

void SwapStep::choose_activation_codecs(const Batch& batch) {
  executor_.settle();  // the last step's updates land before the probe loads a sub-model
  Residency& residency = executor_.residency();
  const int64_t subs = plan_.size();
  auto load = [&](int64_t sub) {
    residency.hold(swap::unit_of(sub, subs));
    residency.complete(swap::unit_of(sub, subs));
  };
  auto evict = [&](int64_t sub) { residency.drop(swap::unit_of(sub, subs)); };
  // The census: each sub-model's forward, then each one's backward in reverse over its input.
  auto census = [&] {
    AutocastGuard guard(device_.type(), autocast_.value_or(at::kFloat), autocast_.has_value());
    std::vector<at::Tensor> inputs(static_cast<size_t>(subs)), outputs(static_cast<size_t>(subs)),
        aux(static_cast<size_t>(subs));
    at::Tensor x = model_->embed(batch.inputs.to(device_));
    for (int64_t i = 0; i < subs; ++i) {
      const swap::SubModel& sub = plan_.sub(i);
      load(i);
      inputs[i] = i == 0 ? x : x.detach().requires_grad_(true);
      const BlockOutput blocks = model_->run_blocks(inputs[i], sub.first, sub.end);
      x = outputs[i] = i + 1 == subs ? model_->head(blocks.x, batch.targets.to(device_), blocks.aux_loss).loss.to(at::kFloat)
                                     : blocks.x;
      if (i + 1 < subs && blocks.aux_loss.requires_grad()) aux[i] = blocks.aux_loss;
      evict(i);
    }
    at::Tensor grad;
    for (int64_t i = subs - 1; i >= 0; --i) {
      load(i);
      std::vector<at::Tensor> roots{outputs[i]}, grads{grad.defined() ? grad : at::ones_like(outputs[i])};
      if (aux[i].defined()) {
        roots.push_back(aux[i]);
        grads.push_back(at::ones_like(aux[i]));
      }
      grad = torch::autograd::grad(roots, {inputs[i]}, grads, /*retain_graph=*/false, /*create_graph=*/false,
                                   /*allow_unused=*/true)
                 .front();
      evict(i);
    }
  };
  ActivationProbing probing = options_.probing;
  probing.around_block = [&](int64_t layer, const std::function<void()>& fn) {
    int64_t i = 0;
    while (plan_.sub(i).end <= layer) ++i;
    load(i);
    try {
      fn();
    } catch (...) {
      evict(i);
      throw;
    }
    evict(i);
  };
  load(swap::kEnds);  // the embedding and the head, held through the probe
  try {
    note_ = tessera::choose_activation_codecs(model_, probing, device_, autocast_, census);
  } catch (...) {
    evict(swap::kEnds);
    throw;
  }
  evict(swap::kEnds);
}

std::optional<std::string> SwapStep::take_note() {
  std::optional<std::string> note;
  note.swap(note_);
  return note;
}

StepLosses SwapStep::run(const std::vector<Batch>& batches, double lr, const GradientsReady& gradients_ready) {
  const auto micro_batches = static_cast<int64_t>(batches.size());
  // Clipping needs the global norm, replicas the averaged gradients and a caller that may hold the
  // gradients out its answer, before any update.
  const bool defer = options_.grad_clip > 0 || owner_.replicated() || gradients_ready;
  if (plan_.micro_batches != micro_batches || plan_.defer_optim != defer) {
    plan_.micro_batches = micro_batches;
    plan_.defer_optim = defer;
    plan_ = swap::build_swap_plan(plan_);
    swap::validate_swap_plan(plan_);
  }
  model_->train();
  if (model_->adaptive_activation_codecs() && probes_before(options_.probing, steps_run_))
    choose_activation_codecs(batches.front());
  ++steps_run_;
  ce_sum_ = at::zeros({}, at::kDouble);
  aux_sum_ = at::zeros({}, at::kDouble);
  StepLosses result;
  swap::SwapWork work;
  work.compute = [&](const swap::Action& a) { compute(a, batches); };
  // Set by gradients_stored on the host stream, before any update (the plan defers them when
  // gradients_ready is given); read by the update jobs on that same stream, not where they are
  // issued (ThreadSanitizer: an update issued before gradients_stored ran read it unset), and they
  // may run after this call returns (they overlap the next step's forward): shared, not on the stack.
  const auto apply = std::make_shared<std::atomic<bool>>(true);
  work.update = [&](const swap::Action& a) -> std::function<void()> {
    return [this, sub = a.sub, lr, apply] {
      if (!*apply) return;
      fault::point("optimizer");
      owner_.update(sub, lr);
    };
  };
  work.gradients_stored = [&] {
    owner_.reduce_gradients();
    if (gradients_ready) *apply = gradients_ready();
    if (*apply)
      result.update.grad_norm = at::scalar_tensor(owner_.gradients_stored(options_.grad_clip), at::kDouble);
  };
  try {
    timeline_ = executor_.run(plan_, work);
  } catch (...) {
    stash_.clear();
    owner_.end_step();
    throw;
  }
  require(stash_.empty(), "internal: the swap step left ", stash_.size(), " sub-models without their backward");
  if (!*apply) {
    owner_.end_step();  // the held gradients dropped; the next step's stores start afresh
    result.update.applied = false;
  }
  result.ce_sum = ce_sum_;
  result.aux_sum = aux_sum_;
  return result;
}

double SwapStep::evaluate(const std::vector<Batch>& batches) {
  executor_.settle();
  torch::NoGradGuard no_grad;
  model_->eval();
  AutocastGuard guard(device_.type(), autocast_.value_or(at::kFloat), autocast_.has_value());
  const int64_t subs = plan_.size();
  std::vector<BlockOutput> states(batches.size());  // each batch's hidden state (and last aux loss)
  at::Tensor total = at::zeros({}, at::kDouble);
  swap::SwapWork work;
  work.compute = [&](const swap::Action& a) {  // every batch through sub-model a.sub
    if (a.sub == 0)
      for (size_t b = 0; b < batches.size(); ++b) states[b].x = model_->embed(batches[b].inputs.to(device_));
    const swap::SubModel& sub = plan_.sub(a.sub);
    for (BlockOutput& state : states) state = model_->run_blocks(state.x, sub.first, sub.end);
    if (a.sub + 1 == subs)
      for (size_t b = 0; b < batches.size(); ++b)
        total += model_->head(states[b].x, batches[b].targets.to(device_), states[b].aux_loss).ce_loss.to(at::kCPU, at::kDouble);
  };
  work.gradients_stored = [] {};  // a forward makes no gradients
  try {
    executor_.run(swap::forward_only_swap_plan(plan_), work);
  } catch (...) {
    owner_.drain();
    model_->train();
    throw;
  }
  model_->train();
  return total.item<double>() / static_cast<double>(batches.size());
}

std::optional<std::string> SwapStep::write_timeline(const std::string& dir, int64_t step) {
  const std::string name = "swap_step" + std::to_string(step);
  const std::vector<swap::TimedAction>& timeline = this->timeline();
  double measured = 0, compute = 0;
  for (const swap::TimedAction& t : timeline) {
    measured = std::max(measured, t.end);
    if (t.action.op == swap::Op::ComputeF || t.action.op == swap::Op::ComputeB) compute += t.end - t.start;
  }
  char title[240];
  std::snprintf(title, sizeof title, "swap step, %lld sub-models, %lld micro-batches, measured: step %.1f ms, compute "
                "%.1f ms, exposed load %.1f ms", static_cast<long long>(plan_.size()),
                static_cast<long long>(plan_.micro_batches), 1000 * measured, 1000 * compute,
                1000 * swap::exposed_load(timeline));
  write_file_durable(dir + "/" + name + ".svg", swap::swap_timeline_svg(timeline, title));
  const swap::SwapTimeline planned = swap::simulate_swap_plan(plan_);
  std::snprintf(title, sizeof title, "swap step planned: step %.1f ms, compute %.1f ms, exposed load %.1f ms "
                "(%.0f%% of loading hidden)", 1000 * planned.step_time, 1000 * planned.compute_time,
                1000 * planned.exposed_load, 100 * planned.overlap());
  write_file_durable(dir + "/" + name + ".planned.svg", swap::swap_timeline_svg(planned.actions, title));
  char note[160];
  std::snprintf(note, sizeof note, "swap timeline of step %lld (%.1f ms): %s.svg, %s.planned.svg",
                static_cast<long long>(step), 1000 * measured, name.c_str(), name.c_str());
  return std::string(note);
}

void SwapStep::add_bench_fields(nlohmann::json& out) {
  const swap::SwapTimeline predicted = swap::simulate_swap_plan(plan_);
  out["swap"] = {{"boundaries", plan_.boundaries()},
                 {"bandwidth", plan_.bandwidth},
                 {"device_budget_bytes", plan_.device_budget_bytes},
                 {"planned_device_peak_bytes", swap::occupancy(plan_).peak},
                 {"host_bytes", options_.host_bytes},
                 {"predicted_step_s", predicted.step_time},
                 {"predicted_exposed_load_s", predicted.exposed_load},
                 {"load_s", predicted.load_time},
                 {"measured_exposed_load_s", swap::exposed_load(timeline())}};
  // The last timed step's timeline: compute busy time, the host's updates, and what ran after the
  // last compute; the updates as the plan prices them beside it.
  auto update_time = [](const std::vector<swap::TimedAction>& actions) {
    double s = 0;
    for (const swap::TimedAction& t : actions)
      if (t.action.op == swap::Op::Optim) s += t.end - t.start;
    return s;
  };
  double compute = 0, last_compute = 0, end = 0;
  for (const swap::TimedAction& t : timeline()) {
    end = std::max(end, t.end);
    if (t.action.op != swap::Op::ComputeF && t.action.op != swap::Op::ComputeB) continue;
    compute += t.end - t.start;
    last_compute = std::max(last_compute, t.end);
  }
  out["swap"]["measured_compute_s"] = compute;
  out["swap"]["measured_plan_s"] = end;
  out["swap"]["measured_tail_s"] = end - last_compute;
  out["swap"]["measured_update_s"] = update_time(timeline());
  out["swap"]["predicted_compute_s"] = predicted.compute_time;
  out["swap"]["predicted_update_s"] = update_time(predicted.actions);
}

}  // namespace tessera
