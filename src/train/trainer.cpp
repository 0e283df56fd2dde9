#include "train/trainer.h"

#include <chrono>
#include <cmath>
#include <filesystem>
#include <optional>
#include <set>

#include <ATen/ATen.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "core/error.h"
#include "core/fs.h"
#include "data/prepare.h"
#include "data/sampler.h"
#include "data/token_file.h"
#include "data/tokenizer.h"
#include "model/hf_names.h"
#include "optim/compression/compressor.h"
#include "train/device_peak.h"
#include "train/metrics.h"
#include "train/progress.h"
#include "train/train_step.h"

namespace tessera {
namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// This rank's random stream states (core/random_streams.h) as checkpoint entries
// "rng.rank<r>.<stream>.<device type>": each rank writes its own, whole.
NamedTensors random_stream_states(int64_t rank, const at::Device& device) {
  NamedTensors out;
  for (auto& [name, state] : random::states(device.is_cuda() ? std::optional<at::Device>(device) : std::nullopt))
    out.emplace_back("rng.rank" + std::to_string(rank) + "." + name, std::move(state));
  return out;
}

// Restores this rank's random streams from a checkpoint's entries. A checkpoint written by fewer
// ranks (or before streams were saved per rank) has none for this rank: the streams are then
// seeded afresh from train.seed and the step, and the returned note says so (the run goes on, but
// its dropout masks are not those an uninterrupted run would draw).
std::string restore_random_streams(const std::map<std::string, at::Tensor>& tensors, int64_t rank,
                                   const at::Device& device, int64_t step, TrainStep& trainer,
                                   const std::string& source) {
  const std::string prefix = "rng.rank" + std::to_string(rank) + ".";
  std::vector<std::pair<std::string, at::Tensor>> mine;
  for (const auto& [name, t] : tensors)
    if (name.rfind(prefix, 0) == 0) mine.emplace_back(name.substr(prefix.size()), t);
  const std::optional<at::Device> cuda = device.is_cuda() ? std::optional<at::Device>(device) : std::nullopt;
  const bool complete = mine.size() == random::states(cuda).size();
  if (complete) {
    random::load_states(mine, cuda, source);
    return "";
  }
  trainer.seed_random_streams(step);
  return "resume: " + source + " holds no random stream states for rank " + std::to_string(rank) +
         " (written by fewer ranks, or on another device type); dropout streams re-seeded from train.seed and step " +
         std::to_string(step);
}

// Restores this rank's gradient-compression state (checkpoint/checkpoint.h keeps one file per
// saving rank). The same number of ranks and the same compressor continue exactly; another number
// of ranks loads the merged state (optim/compression/compressor.h). Anything else starts the
// compressor afresh. Returns a note for the log when the continuation is not exact.
// `ranks` and `rank`: the ranks that reduce gradients (dp x sp) and this one's place among them.
std::string restore_compression(const ParallelOptions& parallel, int64_t ranks_now, int64_t rank, TrainStep& trainer,
                                const LoadedCheckpoint& ckpt) {
  const std::string configured = parallel.grad_compression;
  const std::string saved = ckpt.meta.value("grad_compression", std::string("none"));
  const auto ranks = static_cast<int64_t>(ckpt.compression.size());
  const std::string files = ckpt.dir + "/compression-*-of-" + std::to_string(ranks) + ".safetensors";
  if (configured == "none" || ranks_now == 1)
    return ranks > 0 ? files + ": gradient-compression state not used (this run does not compress)" : "";
  if (ranks == 0 || saved != configured)
    return "parallel.grad_compression = " + configured + ": the checkpoint holds no " + configured +
           " state; the compressor starts afresh (error-feedback residuals zero)";
  if (ranks == ranks_now) {
    trainer.load_compression_state(ckpt.compression[static_cast<size_t>(rank)], files);
    return "";
  }
  trainer.load_compression_state(compression::merge_rank_states(ckpt.compression, files), files);
  return files + ": gradient-compression state of " + std::to_string(ranks) + " ranks merged for " +
         std::to_string(ranks_now) + " ranks (each takes the mean residual)";
}

}  // namespace

struct Trainer::State {
  Config config;
  std::string run_dir;
  std::string resume;
  c10::Device device{at::kCPU};

  std::string data_dir;
  std::optional<TokenFile> train_tokens, val_tokens;
  std::unique_ptr<BatchSampler> sampler;
  std::vector<Batch> eval_batches;
  double unigram = 0;

  std::unique_ptr<TrainStep> trainer;
  comm::Mesh* mesh = nullptr;
  int64_t rank = 0, dp = 1, dp_rank = 0;

  int64_t step = 0;
  int64_t tokens_seen = 0;
  double elapsed_before = 0;  // seconds trained before this process (resume)
  std::vector<std::string> resume_notes;  // printed once the progress line exists
};

Trainer::Trainer(Config config, std::string run_dir, std::string resume, comm::Mesh* mesh)
    : state_(std::make_unique<State>()) {
  State& s = *state_;
  s.config = std::move(config);
  s.run_dir = std::move(run_dir);
  s.resume = std::move(resume);
  s.mesh = mesh;
  if (mesh) {
    s.rank = mesh->rank();
    s.dp = mesh->dims().dp();
    s.dp_rank = mesh->coord().dp;
  }
  const Config& c = s.config;

  s.data_dir = c.data.path;
  if (!fs::is_directory(s.data_dir))
    fail("data.path = \"", s.data_dir, "\": no such directory (create it with `tessera prepare --out ", s.data_dir, "`)");
  auto tokenizer = load_tokenizer(s.data_dir);
  require(tokenizer->vocab_size() <= c.model.vocab_size, s.data_dir, "/tokenizer.json: vocabulary of ",
          tokenizer->vocab_size(), " tokens does not fit model.vocab_size = ", c.model.vocab_size);
  s.train_tokens = TokenFile::open((fs::path(s.data_dir) / c.data.train_file).string());
  s.val_tokens = TokenFile::open((fs::path(s.data_dir) / c.data.val_file).string());
  for (const TokenFile* file : {&*s.train_tokens, &*s.val_tokens})
    require(file->vocab_bound() <= c.model.vocab_size, file->path(), ": holds token id ", file->vocab_bound() - 1,
            ", outside model.vocab_size = ", c.model.vocab_size);
  s.sampler = std::make_unique<BatchSampler>(*s.train_tokens, c.train.batch_size * s.dp, c.train.seq_len,
                                             static_cast<uint64_t>(c.data.seed), s.dp_rank * c.train.batch_size,
                                             c.train.batch_size);
  s.eval_batches = evaluation_batches(*s.val_tokens, c.eval.batches, c.train.batch_size * s.dp, c.train.seq_len);
  s.unigram = unigram_entropy(*s.train_tokens);

  s.trainer = std::make_unique<TrainStep>(c, mesh);
  s.device = s.trainer->device();

  if (!s.resume.empty()) {
    // Under ZeRO 1-3 each rank reads only the optimizer slices it owns.
    LoadedCheckpoint ckpt = load_checkpoint(s.resume, true, s.trainer->training_state_ranges(), /*with_model=*/false);
    const std::string model_file = model_source(ckpt);
    const int64_t shards = ckpt.meta.value("optimizer_shards", int64_t{0});
    const std::string optim_file =
        ckpt.dir + (shards > 0 ? "/optimizer-*-of-" + std::to_string(shards) + ".safetensors" : "/optimizer.safetensors");
    std::set<std::string> model_names;
    for (const auto& [name, file] : ckpt.model_files) model_names.insert(name);
    s.trainer->load_model_state(
        model_names, [&ckpt](const std::string& name) { return read_model_tensor(ckpt, name); }, model_file);
    s.trainer->load_training_state(ckpt.optimizer, optim_file);
    const std::string note =
        restore_compression(c.parallel, s.mesh ? s.mesh->world_size() : 1, s.rank, *s.trainer, ckpt);
    if (!note.empty()) s.resume_notes.push_back(note);
    const std::string rng_note = restore_random_streams(ckpt.optimizer, s.rank, s.device, ckpt.step, *s.trainer, optim_file);
    if (!rng_note.empty()) s.resume_notes.push_back(rng_note);
    s.step = ckpt.step;
    s.sampler->seek(ckpt.meta.at("data").at("position").get<int64_t>());
    s.tokens_seen = ckpt.meta.value("tokens_seen", int64_t{0});
    s.elapsed_before = ckpt.meta.value("elapsed_s", 0.0);
    require(s.step <= c.train.steps, ckpt.dir, ": checkpoint is at step ", s.step, ", beyond train.steps = ",
            c.train.steps);
  }
}

Trainer::~Trainer() = default;

TrainSummary Trainer::run() {
  State& s = *state_;
  const Config& c = s.config;
  const bool lead = s.rank == 0, distributed = s.mesh && s.mesh->world_size() > 1;
  fs::create_directories(s.run_dir + (distributed ? "/logs" : ""));
  const bool resumed = !s.resume.empty();
  std::optional<MetricsLog> metrics;
  if (lead) {
    write_file_atomic(s.run_dir + "/config.toml", c.to_toml_string());
    metrics.emplace(s.run_dir + "/metrics.jsonl", resumed ? s.step : -1);
  }
  Progress progress(c.train.steps,
                    distributed ? s.run_dir + "/logs/rank_" + std::to_string(s.rank) + ".log" : s.run_dir + "/train.log",
                    resumed, lead);

  const int64_t tokens_per_step = c.train.batch_size * s.dp * c.train.seq_len * c.train.grad_accum;
  const int64_t devices = distributed ? s.mesh->world_size() : 1;
  const double flops_per_tok = flops_per_token(c.model, c.train.seq_len);
  const DevicePeak peak = device_peak(s.device, s.trainer->compute_dtype(), c.train.peak_tflops);
  {
    std::ostringstream head;
    head << "tessera: " << parameter_count(c.model) / 1e6 << "M parameters (" << c.model.arch << ", " << c.model.ffn
         << "), " << s.train_tokens->size() << " training tokens, " << tokens_per_step << " tokens/step, "
         << c.precision.dtype << " on " << s.device << "; unigram baseline " << s.unigram << " nats; peak "
         << peak.flops / 1e12 << " TFLOP/s (" << peak.basis << ")";
    if (distributed) head << "; " << s.mesh->dims().describe() << ", zero_stage " << c.parallel.zero_stage;
    if (resumed) head << "; resumed at step " << s.step;
    progress.message(head.str());
    for (const std::string& note : s.resume_notes) progress.message(note);
  }

  TrainSummary summary;
  summary.unigram_baseline = s.unigram;
  const auto run_start = Clock::now();
  auto interval_start = Clock::now();
  int64_t interval_steps = 0;
  double interval_loss = 0, interval_aux = 0;
  std::string last_checkpoint;

  // Every rank takes part in gathering the state. One process writes a plain checkpoint; several
  // write one optimizer shard each into the same partial directory, and rank 0 commits it after
  // a barrier (checkpoint/checkpoint.h).
  const std::string checkpoints_dir = s.run_dir + "/checkpoints";
  const bool compressing = distributed && c.parallel.grad_compression != "none";
  auto save = [&]() {
    CheckpointContents contents;
    const NamedTensors rng = random_stream_states(s.rank, s.device);
    if (distributed) {
      // Every rank writes its share of the model and its slices of the optimizer state.
      const int64_t world = s.mesh->world_size();
      contents.model_shards = world;
      if (lead) prepare_checkpoint_dir(checkpoints_dir, s.step);
      s.mesh->world().barrier();
      write_model_shard(partial_checkpoint_dir(checkpoints_dir, s.step), s.rank, world,
                        s.trainer->model_state_shard(s.rank, world));
      std::vector<TensorSlice> slices = s.trainer->training_state_slices(s.rank, world);
      for (const auto& [name, state] : rng) slices.push_back({name, state, 0, state.sizes().vec()});
      write_optimizer_shard(partial_checkpoint_dir(checkpoints_dir, s.step), s.rank, world, slices);
      if (compressing)
        write_compression_state(partial_checkpoint_dir(checkpoints_dir, s.step), s.rank, world,
                                s.trainer->compression_state());
      s.mesh->world().barrier();
      if (!lead) return;
    }
    contents.meta = {{"config", c.to_toml_string()},
                     {"data", {{"path", s.data_dir}, {"seed", c.data.seed}, {"position", s.sampler->position()}}},
                     {"tokens_seen", s.tokens_seen},
                     {"elapsed_s", s.elapsed_before + seconds_since(run_start)},
                     {"torch_version", TORCH_VERSION},
                     {"grad_compression", compressing ? c.parallel.grad_compression : "none"}};
    if (compressing) contents.compression_ranks = s.mesh->world_size();
    for (const char* name : {"tokenizer.json", "encoder.json", "vocab.bpe"}) {
      fs::path file = fs::path(s.data_dir) / name;
      if (fs::exists(file)) contents.extra_files.push_back(file.string());
    }
    if (!distributed) {
      contents.model = s.trainer->model_state();
      contents.optimizer = s.trainer->training_state();
      contents.optimizer.insert(contents.optimizer.end(), rng.begin(), rng.end());
    }
    last_checkpoint = distributed ? commit_checkpoint(checkpoints_dir, s.step, contents, s.mesh->world_size())
                                  : save_checkpoint(checkpoints_dir, s.step, contents);
    prune_checkpoints(checkpoints_dir, c.checkpoint.keep);
    progress.message("checkpoint: " + last_checkpoint);
  };

  while (s.step < c.train.steps) {
    const double lr = learning_rate(c.optim, s.step, c.train.steps);
    std::vector<Batch> micro_batches;
    for (int64_t micro = 0; micro < c.train.grad_accum; ++micro) micro_batches.push_back(s.sampler->next());
    const StepResult result = s.trainer->run(micro_batches, lr);
    // A non-finite loss, or a non-finite gradient norm that no loss scaler handled, ends the run
    // here, before anything is saved: every rank sees the same values (averaged over the replicas,
    // a global norm), so every rank stops at the same step.
    const bool finite_loss = std::isfinite(result.ce_loss) && std::isfinite(result.aux_loss);
    if (!finite_loss || (!result.skipped && !std::isfinite(result.grad_norm)))
      fail("step ", s.step + 1, ": ", finite_loss ? "the gradient norm" : "the training loss", " is ",
           finite_loss ? result.grad_norm : result.ce_loss + result.aux_loss,
           " (not finite); the run stops without saving this step (",
           last_checkpoint.empty() ? std::string("no checkpoint written by this run") : "last checkpoint " + last_checkpoint,
           "). Common causes: optim.lr too high, precision.dtype = fp16 without enough range, bad data");
    if (result.skipped)
      progress.message("step " + std::to_string(s.step + 1) + ": fp16 overflow, update skipped, loss scale now " +
                       std::to_string(s.trainer->loss_scaler()->value()));
    interval_loss += result.ce_loss;
    interval_aux += result.aux_loss;
    ++s.step;
    ++interval_steps;
    s.tokens_seen += tokens_per_step;

    const bool last = s.step == c.train.steps;
    if (s.step % c.train.log_every == 0 || last) {
      const double interval_s = seconds_since(interval_start);
      const double loss = interval_loss / interval_steps;
      const double tokens_per_s = static_cast<double>(tokens_per_step * interval_steps) / interval_s;
      nlohmann::json line = {{"step", s.step},
                             {"loss", loss},
                             {"lr", lr},
                             {"tokens_per_s", tokens_per_s},
                             {"mfu", flops_per_tok * tokens_per_s / (peak.flops * static_cast<double>(devices))},
                             {"grad_norm", result.grad_norm},
                             {"tokens", s.tokens_seen},
                             {"elapsed_s", s.elapsed_before + seconds_since(run_start)}};
      if (c.model.ffn == "moe") line["aux_loss"] = interval_aux / interval_steps;
      if (const auto* scaler = s.trainer->loss_scaler()) line["loss_scale"] = scaler->value();
      if (metrics) metrics->write(line);
      progress.update(s.step, loss, tokens_per_s, interval_s / interval_steps);
      summary.last_loss = loss;
      interval_loss = interval_aux = 0;
      interval_steps = 0;
      interval_start = Clock::now();
    }
    if ((c.eval.every > 0 && s.step % c.eval.every == 0) || last) {
      const double val_loss = s.trainer->evaluate(s.eval_batches);
      if (metrics)
        metrics->write({{"step", s.step}, {"val_loss", val_loss}, {"elapsed_s", s.elapsed_before + seconds_since(run_start)}});
      char text[96];
      std::snprintf(text, sizeof(text), "eval: step %lld val_loss %.4f", static_cast<long long>(s.step), val_loss);
      progress.message(text);
      summary.last_val_loss = val_loss;
      interval_start = Clock::now();  // evaluation time is not training throughput
    }
    if ((c.checkpoint.every > 0 && s.step % c.checkpoint.every == 0) || last) {
      save();
      interval_start = Clock::now();
    }
  }
  summary.steps = s.step;
  summary.checkpoint = last_checkpoint;
  return summary;
}

}  // namespace tessera
