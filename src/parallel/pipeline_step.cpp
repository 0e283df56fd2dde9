// A training step through pipeline stages (pipeline_step.h).
#include "parallel/pipeline_step.h"

#include <torch/autograd.h>
#include <torch/utils.h>

#include "core/error.h"
#include "core/fault_injection.h"
#include "core/fs.h"
#include "memory/saved_activations.h"
#include "parallel/pipeline/executor.h"
#include "parallel/pipeline/schedule_builders.h"
#include "parallel/pipeline/timeline_svg.h"
#include "precision/autocast.h"

namespace tessera {

using pipeline::Action;
using pipeline::Op;

PipelineStep::Roots PipelineStep::Stash::roots() const {
  Roots r;
  r.tensors.push_back(output);
  r.grads.push_back(grad_out.defined() ? grad_out : at::ones_like(output));  // the last stage: its loss
  if (aux.defined()) {
    r.tensors.push_back(aux);
    r.grads.push_back(at::ones_like(aux));
  }
  return r;
}

void PipelineStep::Stash::drop_graph() {
  input.reset();
  embedded.reset();
  output.reset();
  aux.reset();
  grad_out.reset();
}

namespace {

// `into` += k x `c`, cost by cost (the per-stage and per-rank ones as far as both have them).
void add_scaled(pipeline::ActionCosts& into, const pipeline::ActionCosts& c, double k) {
  for (auto [sum, add] : {std::pair{&into.f, c.f}, {&into.b, c.b}, {&into.i, c.i}, {&into.w, c.w},
                          {&into.optim, c.optim}, {&into.transfer, c.transfer}, {&into.send, c.send},
                          {&into.post, c.post}})
    *sum += k * add;
  for (size_t s = 0; s < std::min(into.stages.size(), c.stages.size()); ++s) {
    into.stages[s].f += k * c.stages[s].f;
    into.stages[s].b += k * c.stages[s].b;
    into.stages[s].i += k * c.stages[s].i;
    into.stages[s].w += k * c.stages[s].w;
  }
  for (size_t r = 0; r < std::min(into.rank_optim.size(), c.rank_optim.size()); ++r) into.rank_optim[r] += k * c.rank_optim[r];
}

}  // namespace

PipelineStep::PipelineStep(TransformerLM model, ResidentOwner& owner, comm::Mesh& mesh, const ParallelOptions& parallel,
                           const Layout& layout, const PipelineStepOptions& options, c10::Device device,
                           std::optional<at::ScalarType> autocast)
    : model_(std::move(model)),
      owner_(owner),
      mesh_(mesh),
      pipe_(mesh.group("pp")),
      down_(mesh.group("pp_down")),
      options_(options),
      sequence_shards_(parallel.megatron_sp ? parallel.tp : 1),
      device_(device),
      autocast_(autocast),
      cut_(layout.cut()),
      transfer_dtype_(parallel.pp_transfer_dtype == "compute" && autocast ? *autocast : at::kFloat),
      table_(parallel, layout) {
  for (const auto& p : model_->parameters())
    if (p.requires_grad()) trained_.push_back(p);
  const bool gathers = table_.gathers() != pipeline::Gathers::none;
  require(owner_.gathers_by_schedule() == gathers, "internal: the layout's table ", gathers ? "has" : "has no",
          " parameter gathers, but the optimizer owner ", owner_.gathers_by_schedule() ? "shards" : "does not shard",
          " the stages' parameters");
  table_.for_micro_batches(options.micro_batches);
  predicted_costs_ = predicted_costs(layout.dims(), layout.cut());
}

at::Tensor PipelineStep::compute(const Action& a, const at::Tensor& input, const std::vector<Batch>& batches) {
  const Batch& batch = batches[a.micro];
  const bool first = a.stage == 0, last = a.stage + 1 == cut_.stages();
  const std::pair<int64_t, int64_t> key{a.stage, a.micro};
  fault::point(a.op == Op::F ? "forward" : "backward");
  switch (a.op) {
    case Op::F: {
      Stash& s = stash_[key];
      // Held micro-batches beyond the resident ones wait in host memory (memory.resident_micro_batches).
      const bool offloaded = held_offloaded_.count(key) > 0;
      AutocastGuard guard(device_.type(), autocast_.value_or(at::kFloat), autocast_.has_value());
      at::Tensor x;
      if (first) {
        x = model_->embed(batch.inputs.to(device_));
        s.embedded = x;
      } else {
        s.input = input.to(device_, at::kFloat).detach().requires_grad_(true);
        x = s.input;
      }
      const BlockOutput blocks = model_->run_blocks(x, cut_.boundaries[a.stage], cut_.boundaries[a.stage + 1],
                                                    offloaded ? options_.held_offload : nullptr);
      if (!last) {
        s.output = blocks.x;
        if (blocks.aux_loss.requires_grad()) {  // mixture-of-experts blocks: their own loss term
          s.aux = blocks.aux_loss / static_cast<double>(micro_batches_);
          aux_sum_ += blocks.aux_loss.detach().to(at::kCPU, at::kDouble);
        }
        return blocks.x.detach().to(transfer_dtype_);
      }
      const ModelOutput out = model_->head(blocks.x, batch.targets.to(device_), blocks.aux_loss);
      s.output = out.loss.to(at::kFloat) / static_cast<double>(micro_batches_);
      ce_sum_ += out.ce_loss.detach().to(at::kCPU, at::kDouble);
      aux_sum_ += out.aux_loss.detach().to(at::kCPU, at::kDouble);
      return {};
    }
    case Op::B: {
      Stash s = std::move(stash_.at(key));
      stash_.erase(key);
      owner_.before_stage_backward(--backwards_left_ == 0, stage_of(a.stage));
      if (!last) s.grad_out = input.to(device_, s.output.scalar_type());
      const Roots roots = s.roots();
      torch::autograd::backward(roots.tensors, roots.grads);
      return first ? at::Tensor() : s.input.grad().to(transfer_dtype_);
    }
    case Op::I: {
      Stash& s = stash_.at(key);
      if (!last) s.grad_out = input.to(device_, s.output.scalar_type());
      // A fully checkpointed block recomputes inside this backward and accumulates its parameters'
      // gradients here (reentrant checkpointing), so the owner sees this backward too; W then
      // computes the rest (the ends).
      if (options_.full_checkpointing) owner_.before_stage_backward(false, stage_of(a.stage));
      const Roots roots = s.roots();
      // Stage 0 stops at its embedding's output, so that W holds only the weight products there too.
      s.split.emplace(roots.tensors, roots.grads, first ? s.embedded : s.input, trained_);
      const at::Tensor grad = s.split->input_gradient();
      s.drop_graph();  // what W needs is the split's
      return first ? at::Tensor() : grad.to(transfer_dtype_);
    }
    case Op::W: {
      Stash s = std::move(stash_.at(key));
      stash_.erase(key);
      require(s.split.has_value(), "internal: the pipeline schedule ran ", a.str(), " before its I");
      owner_.before_stage_backward(--backwards_left_ == 0, stage_of(a.stage));
      s.split->weight_gradients();
      return {};
    }
    default:
      fail("internal: the pipeline executor asked a stage to compute ", a.str());
  }
}

ModelStage PipelineStep::stage_of(int64_t stage) const {
  return ModelStage(cut_.boundaries[stage], cut_.boundaries[stage + 1]);
}

at::Tensor PipelineStep::activation_buffer(const Batch& batch) const {
  // Under Megatron sequence parallelism a block's activation is this tp rank's sequence chunk.
  const int64_t tokens = batch.inputs.size(1) / sequence_shards_;
  return at::empty({batch.inputs.size(0), tokens, model_->options().n_embd},
                   at::TensorOptions().dtype(transfer_dtype_).device(device_));
}

void PipelineStep::tie_embedding() {
  // One rank holding both ends (V placement) keeps one embedding; a rank holding neither has none.
  if (model_->has_embedding() == model_->has_head()) return;
  for (const auto& [name, spec] : model_->parameter_specs())
    if (spec.tied) owner_.sum_gradient_over(name, mesh_.group("embedding"));
}

void PipelineStep::choose_activation_codecs(const pipeline::Schedule& like, const Batch& batch) {
  // The census: `batch` through every stage and back, each backward by autograd::grad over its
  // input (stage 0: its embedding's output), so no parameter's gradient accumulates.
  std::map<int64_t, Stash> census;  // by stage
  pipeline::StageWork work;
  work.receive_buffer = [&](const Action&) { return activation_buffer(batch); };
  work.compute = [&](const Action& a, const at::Tensor& input) -> at::Tensor {
    const bool first = a.stage == 0, last = a.stage + 1 == cut_.stages();
    Stash& s = census[a.stage];
    if (a.op == Op::F) {
      AutocastGuard guard(device_.type(), autocast_.value_or(at::kFloat), autocast_.has_value());
      at::Tensor x = first ? (s.embedded = model_->embed(batch.inputs.to(device_)))
                           : (s.input = input.to(device_, at::kFloat).detach().requires_grad_(true));
      const BlockOutput blocks = model_->run_blocks(x, cut_.boundaries[a.stage], cut_.boundaries[a.stage + 1], nullptr);
      if (last) {
        s.output = model_->head(blocks.x, batch.targets.to(device_), blocks.aux_loss).loss.to(at::kFloat);
        return {};
      }
      s.output = blocks.x;
      if (blocks.aux_loss.requires_grad()) s.aux = blocks.aux_loss;
      return blocks.x.detach().to(transfer_dtype_);
    }
    if (!last) s.grad_out = input.to(device_, s.output.scalar_type());
    const Roots roots = s.roots();
    const std::vector<at::Tensor> g = torch::autograd::grad(roots.tensors, {first ? s.embedded : s.input}, roots.grads,
                                                            /*retain_graph=*/false, /*create_graph=*/false,
                                                            /*allow_unused=*/true);
    census.erase(a.stage);
    return first ? at::Tensor() : g.front().to(transfer_dtype_);
  };
  const pipeline::Schedule table = pipeline::census_schedule(like);
  probe_note_ = tessera::choose_activation_codecs(model_, options_.probing, device_, autocast_,
                                                  [&] { pipeline::run_schedule(table, pipe_, down_, work); });
}

StepLosses PipelineStep::run(const std::vector<Batch>& batches, double lr, const GradientsReady& gradients_ready) {
  StepLosses losses;
  micro_batches_ = static_cast<int64_t>(batches.size());
  const pipeline::Schedule& schedule = table_.for_micro_batches(micro_batches_);
  if (model_->adaptive_activation_codecs() && probes_before(options_.probing, runs_))
    choose_activation_codecs(schedule, batches.front());
  const std::vector<Action>& row = schedule.ranks[static_cast<size_t>(pipe_.rank())];
  backwards_left_ = 0;
  for (const Action& a : row) backwards_left_ += a.op == Op::B || a.op == Op::W ? 1 : 0;
  held_offloaded_.clear();
  if (options_.resident_micro_batches > 0)
    for (const Action& a : pipeline::held_offloaded_forwards(row, options_.resident_micro_batches))
      held_offloaded_.insert({a.stage, a.micro});
  ce_sum_ = at::zeros({}, at::kDouble);
  aux_sum_ = at::zeros({}, at::kDouble);
  // Under bf16 one copy of each weight for the micro-batches the step holds, where the schedule's
  // parameters stay whole (without ZeRO-3's gathers and releases).
  std::optional<WeightCastCache> casts;
  if (autocast_ && !owner_.gathers_by_schedule()) casts.emplace();
  pipeline::StageWork work;
  work.compute = [&](const Action& a, const at::Tensor& input) { return compute(a, input, batches); };
  work.receive_buffer = [&](const Action&) { return activation_buffer(batches.front()); };
  // An offloaded last block of a stage comes back while the rank waits for its output gradient.
  work.receive_posted = [&](const Action& recv) {
    if (recv.op != Op::RecvB) return;
    const auto it = stash_.find({recv.stage, recv.micro});
    if (it != stash_.end()) fetch_activations_that_made(it->second.output);
  };
  work.complete = [&](const Action& a) { owner_.complete_stage(stage_of(a.stage)); };
  work.parameters = [&](const Action& a) {
    if (a.op == Op::Gather) owner_.fetch_stage(stage_of(a.stage));
    if (a.op == Op::Release) owner_.release_stage(stage_of(a.stage));
    if (a.op == Op::Optim) {
      owner_.finish_gradients();
      tie_embedding();
      if (!gradients_ready || gradients_ready()) {
        fault::point("optimizer");
        losses.update = owner_.apply(lr, options_.grad_clip);
      } else {
        owner_.drop_gradients();
        losses.update.applied = false;
      }
    }
  };
  last_.timeline = pipeline::run_schedule(schedule, pipe_, down_, work, &last_.started);
  if (timing_) timed_.push_back(last_);
  require(stash_.empty() && backwards_left_ == 0, "internal: the pipeline step left ", stash_.size(),
          " micro-batches without their backward");
  at::Tensor sums = at::stack({ce_sum_, aux_sum_});
  pipe_.all_reduce(sums);  // only the last stage's are non-zero
  if (table_.wants_measured_costs(++runs_)) offer_measured_costs();
  if (runs_ == kPredictionCheckedAtStep && predicted_costs_) check_prediction();
  losses.ce_sum = sums[0];
  losses.aux_sum = sums[1];
  return losses;
}

PipelineStep::Measured PipelineStep::measure(const Run& mine, bool transfers) {
  Measured m;
  m.run.timeline = pipeline::gather_timelines(pipe_, mine.timeline);
  if (transfers) {
    if (!clock_offset_) clock_offset_ = pipeline::clock_offset(pipe_);
    at::Tensor started = at::empty({pipe_.size()}, at::kDouble);
    pipe_.all_gather(started, at::full({1}, mine.started - *clock_offset_, at::kDouble));
    const pipeline::TransferCosts costs = pipeline::transfer_costs(
        m.run.timeline, std::vector<double>(started.data_ptr<double>(), started.data_ptr<double>() + started.numel()));
    m.costs.transfer = costs.transfer;
    m.costs.send = costs.send;
    m.costs.post = costs.post;
  }
  // (op, stage) -> (total seconds, count); stage -1 over every stage.
  std::map<std::pair<Op, int64_t>, std::pair<double, int64_t>> durations;
  for (const auto& rank : m.run.timeline) {
    double busy = 0;
    for (const pipeline::TimedAction& t : rank) {
      m.run.step_time = std::max(m.run.step_time, t.end);
      if (t.action.is_transfer()) continue;
      const double d = t.end - t.start;
      if (t.action.is_compute()) {
        busy += d;
        auto& [total, count] = durations[{t.action.op, t.action.stage}];
        total += d;
        count += 1;
      }
      if (t.action.op == Op::Optim) m.costs.rank_optim.push_back(d);
      auto& [total, count] = durations[{t.action.op, -1}];
      total += d;
      count += 1;
    }
    m.run.busy.push_back(busy);
  }
  auto mean = [&](Op op, int64_t stage, double fallback) {
    const auto it = durations.find({op, stage});
    return it == durations.end() ? fallback : it->second.first / static_cast<double>(it->second.second);
  };
  m.costs.f = mean(Op::F, -1, 0);
  m.costs.i = mean(Op::I, -1, 0);
  m.costs.w = mean(Op::W, -1, 0);
  m.costs.b = mean(Op::B, -1, m.costs.i + m.costs.w);
  m.costs.gather = mean(Op::Gather, -1, 0);  // the exposed waits: a lower bound on a fetch
  m.costs.optim = mean(Op::Optim, -1, 0);
  for (int64_t s = 0; s < cut_.stages(); ++s) {
    const double i = mean(Op::I, s, m.costs.i), w = mean(Op::W, s, m.costs.w);
    m.costs.stages.push_back({mean(Op::F, s, m.costs.f), mean(Op::B, s, i + w), i, w});
  }
  if (static_cast<int64_t>(m.costs.rank_optim.size()) != pipe_.size()) m.costs.rank_optim.clear();
  for (Op op : {Op::F, Op::B, Op::I, Op::W})
    if (durations.count({op, -1})) m.ran.push_back(op);
  return m;
}

std::optional<std::string> PipelineStep::write_timeline(const std::string& dir, int64_t step) {
  const std::string name = "pipeline_step" + std::to_string(step);
  const Measured m = measure(last_);
  char note[200];
  std::snprintf(note, sizeof note, "pipeline timeline of step %lld (bubble %.1f%%): %s.svg, %s.planned.svg, %s.trace.json",
                static_cast<long long>(step), 100 * m.run.bubble(), name.c_str(), name.c_str(), name.c_str());
  if (pipe_.rank() != 0) return std::string(note);
  const pipeline::Simulation planned = pipeline::simulate_schedule(table_.current(), m.costs);
  char title[240];
  std::snprintf(title, sizeof title, "%s, pp %lld, %lld micro-batches, measured: step %.1f ms, bubble %.1f%%",
                table_.current().name.c_str(), static_cast<long long>(table_.current().pp),
                static_cast<long long>(table_.current().micro_batches), 1000 * m.run.step_time, 100 * m.run.bubble());
  write_file_durable(dir + "/" + name + ".svg", pipeline::timeline_svg(table_.current(), m.run, title));
  std::snprintf(title, sizeof title, "%s, planned with each stage's measured mean times (over all F %.2f ms, B %.2f "
                "ms, I %.2f ms, W %.2f ms): step %.1f ms, bubble %.1f%%", table_.current().name.c_str(), 1000 * m.costs.f, 1000 * m.costs.b,
                1000 * m.costs.i, 1000 * m.costs.w, 1000 * planned.step_time, 100 * planned.bubble());
  write_file_durable(dir + "/" + name + ".planned.svg", pipeline::timeline_svg(table_.current(), planned, title));
  write_file_durable(dir + "/" + name + ".trace.json", pipeline::timeline_chrome_trace(m.run.timeline, 1.0));
  return std::string(note);
}

void PipelineStep::check_prediction() {
  const Measured m = measure(last_, false);  // no ping-pong inside a (possibly timed) step
  // The pipeline part of the step: to the last rank's optimizer step (the prediction has none).
  double span = 0, busy = 0;
  for (const auto& rank : m.run.timeline)
    for (const pipeline::TimedAction& t : rank)
      if (t.action.op != Op::Optim) span = std::max(span, t.end);
  for (double b : m.run.busy) busy += b;
  const double measured_bubble = 1 - busy / (static_cast<double>(pipe_.size()) * span);
  const pipeline::Simulation predicted = pipeline::simulate_schedule(table_.current(), *predicted_costs_);
  prediction_check_ = {{"step", runs_},
                       {"predicted_s", predicted.step_time},
                       {"measured_s", span},
                       {"predicted_bubble", predicted.bubble()},
                       {"measured_bubble", measured_bubble}};
  char line[300];
  std::snprintf(line, sizeof line,
                "pipeline: step %lld ran its schedule in %.1f ms against %.1f ms predicted from the start-up profile "
                "(x%.2f); bubble %.1f%% against %.1f%% (the prediction counts no transfer)",
                static_cast<long long>(runs_), 1000 * span, 1000 * predicted.step_time, span / predicted.step_time,
                100 * measured_bubble, 100 * predicted.bubble());
  prediction_note_ = line;
}

std::optional<std::string> PipelineStep::take_note() {
  std::optional<std::string> note;
  note.swap(probe_note_);
  if (prediction_note_) note = note ? *note + "\n" + *prediction_note_ : *prediction_note_;
  prediction_note_.reset();
  return note;
}

void PipelineStep::start_timing() {
  timing_ = true;
  timed_.clear();
}

void PipelineStep::add_bench_fields(nlohmann::json& out) {
  const std::vector<Run> steps = timed_.empty() ? std::vector<Run>{last_} : timed_;
  const double n = static_cast<double>(steps.size()), ranks = static_cast<double>(pipe_.size());
  // Sums over the steps: measured and replayed busy time and step time; each cost's mean.
  double busy = 0, step = 0, replay_busy = 0, replay_step = 0;
  pipeline::ActionCosts mean;
  std::vector<pipeline::Op> ran;
  for (const Run& run : steps) {
    Measured m = measure(run);
    for (double b : m.run.busy) busy += b;
    step += m.run.step_time;
    pipeline::ActionCosts each = m.costs;
    for (const auto& rank : m.run.timeline)
      for (const pipeline::TimedAction& t : rank)
        if (t.action.is_compute()) each.each[{t.action.op, t.action.stage, t.action.micro}] = t.end - t.start;
    const pipeline::Simulation replay = pipeline::simulate_schedule(table_.current(), each);
    for (double b : replay.busy) replay_busy += b;
    replay_step += replay.step_time;
    if (&run == &steps.front()) {  // the first step sizes the per-stage and per-rank costs
      ran = m.ran;
      mean.f = mean.b = mean.i = mean.w = 0;
      mean.stages.resize(m.costs.stages.size());
      mean.rank_optim.resize(m.costs.rank_optim.size());
    }
    add_scaled(mean, m.costs, 1 / n);
  }
  const pipeline::Simulation planned = pipeline::simulate_schedule(table_.current(), mean);
  nlohmann::json ms = nlohmann::json::object();
  for (Op op : ran) ms[pipeline::op_name(op)] = 1000 * mean.of(op);
  out["pp_action_ms"] = ms;  // the timed steps' mean compute action, over every rank
  out["pp_transfer_ms"] = {{"transfer", 1000 * mean.transfer}, {"send", 1000 * mean.send}, {"post", 1000 * mean.post}};
  if (!table_.note().empty()) out["pp_table"] = table_.note();
  if (!prediction_check_.is_null()) out["pp_prediction"] = prediction_check_;
  out["pp_bubble"] = {{"steps", steps.size()},
                      {"measured", 1 - busy / (ranks * step)},
                      {"simulated", planned.bubble()},
                      {"replayed", 1 - replay_busy / (ranks * replay_step)},
                      {"measured_step_s", step / n},
                      {"simulated_step_s", planned.step_time},
                      {"replayed_step_s", replay_step / n}};
}

double PipelineStep::evaluate(const std::vector<Batch>& batches) {
  // The forward passes alone, as a table run by the executor on the training table's placement.
  const pipeline::Schedule table = pipeline::forward_only_schedule(table_.current(), static_cast<int64_t>(batches.size()));
  owner_.begin_pass();
  torch::NoGradGuard no_grad;
  model_->eval();
  at::Tensor total = at::zeros({}, at::kDouble);
  const int64_t stages = cut_.stages();
  pipeline::StageWork work;
  work.compute = [&](const Action& a, const at::Tensor& input) {
    const Batch& batch = batches[a.micro];
    AutocastGuard guard(device_.type(), autocast_.value_or(at::kFloat), autocast_.has_value());
    const at::Tensor x = a.stage == 0 ? model_->embed(batch.inputs.to(device_)) : input.to(device_, at::kFloat);
    const BlockOutput blocks = model_->run_blocks(x, cut_.boundaries[a.stage], cut_.boundaries[a.stage + 1]);
    if (a.stage + 1 < stages) return blocks.x.to(transfer_dtype_);
    total += model_->head(blocks.x, batch.targets.to(device_), blocks.aux_loss).ce_loss.to(at::kCPU, at::kDouble);
    return at::Tensor();
  };
  work.receive_buffer = [&](const Action& recv) { return activation_buffer(batches[recv.micro]); };
  pipeline::run_schedule(table, pipe_, down_, work);
  pipe_.all_reduce(total);
  model_->train();
  owner_.end_pass();
  return total.item<double>() / static_cast<double>(batches.size());
}

void PipelineStep::offer_measured_costs() {
  const Measured m = measure(last_, false);
  // Every rank of the world must run the same table (the data replicas' collectives follow it):
  // the stages' mean costs averaged over the world.
  std::vector<double> flat;
  for (const pipeline::ActionCosts::Compute& c : m.costs.stages) flat.insert(flat.end(), {c.f, c.b, c.i, c.w});
  at::Tensor mean = at::tensor(flat, at::kDouble);
  mesh_.world().all_reduce(mean);
  mean /= static_cast<double>(mesh_.world_size());
  const auto v = mean.accessor<double, 1>();
  pipeline::ActionCosts costs;
  for (int64_t s = 0; s < cut_.stages(); ++s) {
    pipeline::ActionCosts::Compute c{v[4 * s], v[4 * s + 1], v[4 * s + 2], v[4 * s + 3]};
    // The unit-cost table splits every backward, so B was not measured: the halves' sum, scaled by
    // what the start-up profile found a whole backward costs against them (same profile on every rank).
    if (predicted_costs_ && s < static_cast<int64_t>(predicted_costs_->stages.size())) {
      const pipeline::ActionCosts::Compute& p = predicted_costs_->stages[s];
      if (p.i + p.w > 0) c.b = (c.i + c.w) * p.b / (p.i + p.w);
    }
    costs.stages.push_back(c);
  }
  table_.offer_measured(costs, runs_);
}

}  // namespace tessera
