#include "train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <optional>
#include <sstream>

#include <ATen/ATen.h>
#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fault_injection.h"
#include "core/fs.h"
#include "data/prepare.h"
#include "data/batch_prefetcher.h"
#include "data/sampler.h"
#include "data/training_data.h"
#include "memory/activation_codec.h"
#include "train/device_peak.h"
#include "train/metrics.h"
#include "train/peak_memory.h"
#include "train/plan_check.h"
#include "train/progress.h"
#include "train/stop_request.h"
#include "train/train_step.h"
#include "train/trainer_state.h"
#include "model/model_size.h"

namespace tessera {
namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// A non-finite loss, or a non-finite gradient norm that no loss scaler handled, ends the run at
// `step`, before anything is saved: every rank sees the same values (averaged over the replicas, a
// global norm), so every rank stops at the same step. So do too many fp16 overflows in a row
// (`consecutive_skips` of precision.max_skipped_steps).
void check_step_result(const StepResult& result, int64_t step, int64_t consecutive_skips, int64_t max_skipped,
                       const std::string& last_checkpoint) {
  const auto stop = [&](const std::string& why, const char* causes) {
    fail("step ", step, ": ", why, "; the run stops without saving this step (",
         last_checkpoint.empty() ? std::string("no checkpoint written by this run") : "last checkpoint " + last_checkpoint,
         "). Common causes: ", causes);
  };
  const bool finite_loss = std::isfinite(result.ce_loss) && std::isfinite(result.aux_loss);
  if (!finite_loss || (!result.skipped && !std::isfinite(result.grad_norm))) {
    std::ostringstream why;
    why << (finite_loss ? "the gradient norm" : "the training loss") << " is "
        << (finite_loss ? result.grad_norm : result.ce_loss + result.aux_loss) << " (not finite)";
    stop(why.str(), "optim.lr too high, precision.dtype = fp16 without enough range, bad data");
  }
  if (consecutive_skips >= max_skipped)
    stop(std::to_string(consecutive_skips) + " consecutive fp16 steps overflowed and were skipped " +
             "(precision.max_skipped_steps = " + std::to_string(max_skipped) + ")",
         "optim.lr too high, bad data; precision.dtype = bf16 has fp32's range");
}

// int4 on a rotary attention core with no codec of its own trains measurably worse: tiny_llama
// ended 2000 steps 11.7% above uncompressed, and 1.0% above with memory.attention_compression = int8
// (docs/memory.md, bench/results/activation_compression_quality_tiny_llama_cpu.md). Empty otherwise.
std::string attention_codec_note(const Config& c) {
  if (c.memory.activation_compression == "adaptive") return "";  // the probe chooses the core's codecs
  const std::vector<ActivationCodec> codecs = parse_activation_codecs(c.memory.activation_compression);
  const bool int4 = std::find(codecs.begin(), codecs.end(), ActivationCodec::int4) != codecs.end();
  if (!int4 || parse_attention_codec(c.memory.attention_compression) || !c.model.rotary() || c.model.arch == "linear")
    return "";
  return "note: memory.activation_compression = int4 rounds the attention core's rotated q and k to 4 bits, which "
         "left tiny_llama 11.7% above uncompressed after 2000 steps; memory.attention_compression = int8 keeps the core "
         "at 8 bits (1.0% above; docs/memory.md)";
}

}  // namespace

Trainer::Trainer(Config config, std::string run_dir, TrainStart start, comm::Mesh* mesh, Collaboration* collaboration)
    : state_(std::make_unique<State>()) {
  State& s = *state_;
  s.config = std::move(config);
  s.run_dir = std::move(run_dir);
  s.resume = std::move(start.resume);
  s.mesh = mesh;
  s.collaboration = collaboration;
  if (mesh) {
    s.rank = mesh->rank();
    s.dp = mesh->dims().dp();
    s.dp_rank = mesh->coord().dp;
  }
  const Config& c = s.config;

  s.data = open_training_data(c.data, c.model.vocab_size);
  s.accumulation = c.train.accumulation(s.dp);
  const uint64_t data_seed = static_cast<uint64_t>(c.data.seed);
  s.sampler = std::make_unique<BatchSampler>(s.data->train, BatchLayout{c.train.batch_size, s.dp, s.dp_rank, s.accumulation},
                                             c.train.seq_len, collaboration ? collaboration->data_seed(data_seed) : data_seed);
  s.eval_batches = evaluation_batches(s.data->val, c.eval.batches, c.train.batch_size * s.dp, c.train.seq_len);
  s.unigram = unigram_entropy(s.data->train);

  // Under parallel.pp_cut = profile the step measures the blocks and cuts by time; the run's config
  // keeps the key, not the measured cut, so a resume at another layout measures again.
  s.trainer = std::make_unique<TrainStep>(c, mesh);
  if (const std::string text = describe_layout(c, s.trainer->layout()); !text.empty()) s.start_notes.push_back(text);
  if (const std::string text = attention_codec_note(c); !text.empty()) s.start_notes.push_back(text);
  s.device = s.trainer->device();

  s.checkpoints.emplace(c, s.run_dir, *s.trainer, mesh, collaboration, *s.data, *s.sampler);
  if (!start.init_from.empty()) s.start_notes.push_back(s.checkpoints->init_from(start.init_from));
  Resumed resumed;  // a resumed run's position (and a resumed peer's swarm state)
  if (!s.resume.empty()) {
    resumed = s.checkpoints->resume(s.resume);
    s.step = resumed.position.step;
    s.tokens_seen = resumed.position.tokens_seen;
    s.elapsed_before = resumed.position.elapsed_s;
    for (std::string& note : resumed.notes) s.start_notes.push_back(std::move(note));
  }
  if (collaboration) s.step = collaboration->attach(*s.trainer, s.step, resumed.collaboration_meta, resumed.collaboration_tensors);
}

Trainer::~Trainer() = default;

double Trainer::State::elapsed_s() const {
  return elapsed_before + seconds_since(run_start);
}

void Trainer::State::save(Progress& progress) {
  const std::string saved = checkpoints->save({step, tokens_seen, elapsed_s()});
  if (!saved.empty()) progress.message("checkpoint: " + saved);
}

bool Trainer::State::stop_requested(bool saved, Progress& progress, TrainSummary& summary) {
  int64_t reason = stop_request::local_reason(seconds_since(run_start), config.train.time_limit);
  if (distributed) {
    at::Tensor flag = at::full({1}, reason, at::TensorOptions().dtype(at::kLong).device(mesh->world().device()));
    mesh->world().all_reduce(flag, comm::ReduceOp::max);
    reason = flag.item<int64_t>();
  }
  if (reason == stop_request::kNone) return false;
  if (!saved) save(progress);
  summary.stopped = stop_request::describe(static_cast<stop_request::Reason>(reason), config.train.time_limit);
  const std::string again = collaboration ? "tessera peer --out " + run_dir + "` (with its --swarm and --listen)"
                                          : "tessera train --resume " + run_dir + "`";
  progress.message("stopped at step " + std::to_string(step) + " of " + std::to_string(config.train.steps) + " (" +
                   summary.stopped + "): checkpoint " + checkpoints->last() + "; continue with `" + again);
  return true;
}

TrainSummary Trainer::run() {
  State& s = *state_;
  const Config& c = s.config;
  s.lead = s.rank == 0;
  s.distributed = s.mesh && s.mesh->world_size() > 1;
  const bool lead = s.lead, distributed = s.distributed;
  fs::create_directories(s.run_dir + (distributed ? "/logs" : ""));
  const bool resumed = !s.resume.empty();
  std::optional<MetricsLog> metrics;
  if (lead) {
    write_file_atomic(s.run_dir + "/config.toml", c.to_annotated_toml());
    metrics.emplace(s.run_dir + "/metrics.jsonl", resumed ? s.step : -1, c.train.tensorboard);
  }
  Progress progress(c.train.steps,
                    distributed ? s.run_dir + "/logs/rank_" + std::to_string(s.rank) + ".log" : s.run_dir + "/train.log",
                    resumed, lead);

  const int64_t tokens_per_step = s.sampler->global_batch() * c.train.seq_len;
  const int64_t devices = distributed ? s.mesh->world_size() : 1;
  const double flops_per_tok = flops_per_token(c.model, c.train.seq_len);
  const DevicePeak peak = device_peak(s.device, s.trainer->compute_dtype(), c.train.peak_tflops);
  {
    std::ostringstream head;
    head << "tessera: " << parameter_count(c.model) / 1e6 << "M parameters (" << c.model.arch << ", " << c.model.ffn
         << "), " << s.data->train.size() << " training tokens, " << tokens_per_step << " tokens/step, "
         << c.precision.dtype << " on " << s.device << "; unigram baseline " << s.unigram << " nats; peak "
         << peak.flops / 1e12 << " TFLOP/s (" << peak.basis << ")";
    if (distributed) head << "; " << s.mesh->dims().describe() << ", zero_stage " << c.parallel.zero_stage;
    if (resumed) head << "; resumed at step " << s.step;
    progress.message(head.str());
    for (const std::string& note : s.start_notes) progress.message(note);
  }
  // train.plan_cluster: the planner's prediction for this layout, checked after a few steps.
  PlanCheck plan_check(c, s.mesh ? s.mesh->dims() : ParallelDims(c.parallel, 1, "the config"));
  if (!plan_check.start_note().empty()) progress.message(plan_check.start_note());

  TrainSummary summary;
  summary.unigram_baseline = s.unigram;
  s.run_start = Clock::now();
  auto interval_start = Clock::now();
  int64_t interval_steps = 0, interval_local = 0, interval_tokens = 0;  // local: steps run, applied or held
  double interval_loss = 0, interval_aux = 0;
  int64_t consecutive_skips = 0;  // fp16 steps skipped for overflow, in a row

  // Each step's batches are drawn (and on CUDA pinned) while the step before it runs.
  BatchPrefetcher prefetcher(*s.sampler, s.device.is_cuda());
  while (s.step < c.train.steps) {
    fault::at_step(s.step + 1);
    const double lr = learning_rate(c.optim, s.step, c.train.steps);
    const std::vector<Batch> micro_batches = prefetcher.next();
    const auto local_start = Clock::now();
    const StepResult result = s.trainer->run(micro_batches, lr);
    if (const auto note = s.trainer->runner().take_note()) progress.message(*note);
    if (c.train.trace_step == s.step + 1) {
      // This step's timeline where the runner records one (pipeline, swap): a collective.
      if (const auto note = s.trainer->runner().write_timeline(s.run_dir, s.step + 1)) progress.message(*note);
    }
    consecutive_skips = result.skipped ? consecutive_skips + 1 : 0;
    check_step_result(result, s.step + 1, consecutive_skips, c.precision.max_skipped_steps, s.checkpoints->last());
    if (result.skipped)
      progress.message("step " + std::to_string(s.step + 1) + ": fp16 overflow, update skipped, loss scale now " +
                       std::to_string(s.trainer->loss_scaler()->value()));
    interval_loss += result.ce_loss;
    interval_aux += result.aux_loss;
    ++interval_local;
    interval_tokens += tokens_per_step;
    s.tokens_seen += tokens_per_step;
    if (s.collaboration) {
      const std::optional<int64_t> jumped =
          s.collaboration->after_local_step(*s.trainer, s.sampler->global_batch(), result.ce_loss, seconds_since(local_start));
      for (const std::string& line : s.collaboration->take_messages()) progress.message(line);
      if (jumped) {
        s.step = *jumped;  // the others' state: this local step's gradients were dropped with the old one
        continue;
      }
    }
    if (!result.applied) {
      // The swarm holds this local step's gradients for a later round: no step was taken.
      if (s.stop_requested(false, progress, summary)) break;
      continue;
    }
    ++s.step;
    ++interval_steps;
    if (const auto note = plan_check.after_step(s.step, seconds_since(local_start))) progress.message(*note);
    if (s.collaboration) {
      s.collaboration->after_update(*s.trainer, s.step);
      for (const std::string& line : s.collaboration->take_messages()) progress.message(line);
    }

    const bool last = s.step == c.train.steps;
    if (s.step % c.train.log_every == 0 || last) {
      const double interval_s = seconds_since(interval_start);
      const double loss = interval_loss / static_cast<double>(interval_local);
      const double tokens_per_s = static_cast<double>(interval_tokens) / interval_s;
      nlohmann::json line = {{"step", s.step},
                             {"loss", loss},
                             {"lr", lr},
                             {"tokens_per_s", tokens_per_s},
                             {"mfu", flops_per_tok * tokens_per_s / (peak.flops * static_cast<double>(devices))},
                             {"grad_norm", result.grad_norm},
                             {"tokens", s.tokens_seen},
                             {"peak_memory_gib", take_peak_memory_gib(s.device)},
                             {"elapsed_s", s.elapsed_s()}};
      if (c.model.ffn == "moe") line["aux_loss"] = interval_aux / static_cast<double>(interval_local);
      if (s.collaboration) line["swarm"] = s.collaboration->metrics();
      // Per MoE layer, this step's routing over every rank (docs/moe.md; scripts/plot_expert_load.py).
      for (const MoELayerStatistics& m : result.moe)
        line["moe"].push_back({{"layer", m.layer},
                               {"balance_loss", m.balance_loss},
                               {"z_loss", m.z_loss},
                               {"dropped", m.dropped_fraction()},
                               {"max_violation", m.max_violation()},
                               {"load", m.load}});
      if (const auto* scaler = s.trainer->loss_scaler()) line["loss_scale"] = scaler->value();
      if (auto planned = plan_check.take_metrics()) line["plan"] = *planned;
      if (metrics) metrics->write(line);
      progress.update(s.step, loss, tokens_per_s, interval_s / interval_steps);
      summary.last_loss = loss;
      interval_loss = interval_aux = 0;
      interval_steps = interval_local = interval_tokens = 0;
      interval_start = Clock::now();
    }
    if ((c.eval.every > 0 && s.step % c.eval.every == 0) || last) {
      const Clock::time_point eval_start = Clock::now();
      const double val_loss = s.trainer->evaluate(s.eval_batches);
      const double eval_s = seconds_since(eval_start);
      if (metrics)
        metrics->write({{"step", s.step}, {"val_loss", val_loss}, {"eval_s", eval_s},
                        {"elapsed_s", s.elapsed_s()}});
      char text[96];
      std::snprintf(text, sizeof(text), "eval: step %lld val_loss %.4f (%.2f s)", static_cast<long long>(s.step), val_loss,
                    eval_s);
      progress.message(text);
      summary.last_val_loss = val_loss;
      interval_start = Clock::now();  // evaluation time is not training throughput
    }
    const bool saved = (c.checkpoint.every > 0 && s.step % c.checkpoint.every == 0) || last;
    if (saved) {
      s.save(progress);
      interval_start = Clock::now();
    }
    if (!last && s.stop_requested(saved, progress, summary)) break;
  }
  if (s.collaboration) s.collaboration->leave();
  summary.steps = s.step;
  summary.checkpoint = s.checkpoints->last();
  return summary;
}

}  // namespace tessera
