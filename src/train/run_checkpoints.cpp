// A run's checkpoints (run_checkpoints.h): writing them by the layout's path, resuming from one at
// any layout, starting from another's weights.
#include "train/run_checkpoints.h"

#include <filesystem>
#include <optional>

#include <ATen/ATen.h>
#include <torch/version.h>

#include "checkpoint/checkpoint.h"
#include "core/error.h"
#include "core/fault_injection.h"
#include "core/random_streams.h"
#include "data/tokenizer.h"
#include "model/hf_config.h"
#include "optim/compression/compressor.h"
#include "train/checkpoint_transfer.h"

namespace tessera {
namespace fs = std::filesystem;
namespace {

std::optional<at::Device> cuda_of(const at::Device& device) {
  return device.is_cuda() ? std::optional<at::Device>(device) : std::nullopt;
}

// This rank's random stream states as checkpoint entries.
NamedTensors random_stream_states(int64_t rank, const at::Device& device) {
  NamedTensors out;
  for (auto& [name, state] : random::states(cuda_of(device)))
    out.emplace_back(random_state_prefix(rank) + name, std::move(state));
  return out;
}

// Restores this rank's random streams from a checkpoint's entries. A checkpoint written by fewer
// ranks (or before streams were saved per rank) has none for this rank: the streams are then
// seeded afresh from train.seed and the step, and the returned note says so (the run goes on, but
// its dropout masks are not those an uninterrupted run would draw).
std::string restore_random_streams(const std::map<std::string, at::Tensor>& tensors, int64_t rank,
                                   const at::Device& device, int64_t step, TrainStep& trainer,
                                   const std::string& source) {
  const std::string prefix = random_state_prefix(rank);
  std::vector<std::pair<std::string, at::Tensor>> mine;
  for (const auto& [name, t] : tensors)
    if (name.rfind(prefix, 0) == 0) mine.emplace_back(name.substr(prefix.size()), t);
  if (mine.size() == random::states(cuda_of(device)).size()) {
    random::load_states(mine, cuda_of(device), source);
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
// `ranks_now` and `rank`: the ranks that reduce gradients and this one's place among them.
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

// The data a resumed run continues on must be the data its checkpoint was drawn from (the same
// shards, in the same order, of the same sizes: the file names, not the directory, so moved data
// resumes), and the position must be the step's (the sampler draws one global batch per step).
// A different global batch is allowed, with a note: the windows after the resume then differ
// from those of an uninterrupted run.
// A collaborating run draws batches apart from its steps (`position_is_step` false): its position
// is only checked to be non-negative.
std::string check_resumed_data(const LoadedCheckpoint& ckpt, const TokenStream& train, int64_t global_batch,
                               bool position_is_step) {
  const std::string meta = ckpt.dir + "/meta.json";
  const nlohmann::json data = meta_field<nlohmann::json>(ckpt.meta, "data", meta);
  const int64_t position = meta_field<int64_t>(data, "position", meta);
  require(position == ckpt.step || (!position_is_step && position >= 0), meta, ": data.position = ", position,
          " disagrees with step ", ckpt.step, " (one global batch is drawn per step); the file is damaged or from an "
          "older tessera");
  if (data.contains("train") && data["train"] != train.manifest())
    fail(meta, ": the checkpoint was trained on the shards ", data["train"].dump(), " but ", train.name(),
         " now holds ", train.manifest().dump(), "; resume on the same data (data.path, data.train_file)");
  const int64_t saved_batch = data.value("global_batch", int64_t{0});
  if (saved_batch != 0 && saved_batch != global_batch)
    return "the global batch changed from " + std::to_string(saved_batch) + " to " + std::to_string(global_batch) +
           " sequences: the data from step " + std::to_string(ckpt.step) + " on differs from the uninterrupted run's";
  return "";
}

}  // namespace

std::string random_state_prefix(int64_t rank) { return "rng.rank" + std::to_string(rank) + "."; }

bool is_random_state(const std::string& name) { return name.rfind("rng.rank", 0) == 0; }

RunCheckpoints::RunCheckpoints(const Config& config, std::string run_dir, TrainStep& step, comm::Mesh* mesh,
                               Collaboration* collaboration, const TrainingData& data, BatchSampler& sampler)
    : config_(config),
      run_dir_(std::move(run_dir)),
      step_(step),
      mesh_(mesh),
      collaboration_(collaboration),
      data_(data),
      sampler_(sampler),
      rank_(mesh ? mesh->rank() : 0) {}

std::string RunCheckpoints::init_from(const std::string& path) {
  const LoadedCheckpoint ckpt = load_checkpoint(path, false, {}, /*with_model=*/false);
  step_.load_model_state(model_reader(ckpt));
  carried_files_ = hf_carried_files(ckpt.dir);
  return "initialized from the model of " + ckpt.dir + " (step 0, a fresh optimizer)";
}

Resumed RunCheckpoints::resume(const std::string& path) {
  // Under ZeRO 1-3 each rank reads only the optimizer slices it owns. With checkpoint.gather the
  // checkpoint is on rank 0's disk: the ranks without it receive a copy first.
  const FetchedCheckpoint source =
      config_.checkpoint.gather && distributed() ? fetch_checkpoint(mesh_->world(), path, run_dir_) : FetchedCheckpoint{path, ""};
  // Each tensor checked by what its owner declares it holds (core/state_kind.h).
  const TrainStep& step = step_;
  const StateKinds kinds{[&step](const std::string& name) {
                           return is_random_state(name) ? StateKind::bytes : step.state_kind(name);
                         },
                         compression::state_kind};
  LoadedCheckpoint ckpt = load_checkpoint(source.dir, true, step_.training_state_ranges(), /*with_model=*/false, kinds);
  const int64_t shards = ckpt.meta.value("optimizer_shards", int64_t{0});
  const std::string optim_file =
      ckpt.dir + (shards > 0 ? "/optimizer-*-of-" + std::to_string(shards) + ".safetensors" : "/optimizer.safetensors");
  step_.load_model_state(model_reader(ckpt));
  carried_files_ = hf_carried_files(ckpt.dir);
  step_.load_training_state(ckpt.optimizer, optim_file);

  Resumed out;
  const auto note = [&out](std::string text) {
    if (!text.empty()) out.notes.push_back(std::move(text));
  };
  note(restore_compression(config_.parallel, mesh_ ? mesh_->world_size() : 1, rank_, step_, ckpt));
  note(restore_random_streams(ckpt.optimizer, rank_, step_.device(), ckpt.step, step_, optim_file));
  note(check_resumed_data(ckpt, data_.train, sampler_.global_batch(), !collaboration_));
  const std::string meta = ckpt.dir + "/meta.json";
  sampler_.seek(meta_field<int64_t>(ckpt.meta["data"], "position", meta));
  if (collaboration_) {
    out.collaboration_meta = meta_field<nlohmann::json>(ckpt.meta, "collaboration", meta);
    out.collaboration_tensors = ckpt.optimizer;
  }
  RunPosition& at = out.position;
  at.step = ckpt.step;
  at.tokens_seen = meta_field<int64_t>(ckpt.meta, "tokens_seen", meta);
  at.elapsed_s = meta_field<double>(ckpt.meta, "elapsed_s", meta);
  require(at.tokens_seen >= 0 && at.elapsed_s >= 0, meta, ": tokens_seen ", at.tokens_seen, " or elapsed_s ",
          at.elapsed_s, " is negative");
  require(at.step <= config_.train.steps, ckpt.dir, ": checkpoint is at step ", at.step, ", beyond train.steps = ",
          config_.train.steps);
  if (!source.received.empty()) fs::remove_all(source.received);
  return out;
}

nlohmann::json RunCheckpoints::meta(const RunPosition& position) const {
  const Config& c = config_;
  nlohmann::json out = {{"config", c.to_toml_string()},
                        {"data",
                         {{"path", c.data.path},
                          {"seed", c.data.seed},
                          {"position", sampler_.position()},
                          {"global_batch", sampler_.global_batch()},
                          {"train", data_.train.manifest()}}},
                        {"tokens_seen", position.tokens_seen},
                        {"elapsed_s", position.elapsed_s},
                        {"torch_version", TORCH_VERSION},
                        {"grad_compression", compressing() ? c.parallel.grad_compression : "none"}};
  if (collaboration_) out["collaboration"] = collaboration_->checkpoint_state();
  return out;
}

std::string RunCheckpoints::write(const RunPosition& position) {
  const Config& c = config_;
  const std::string dir = checkpoints_dir();
  const int64_t step = position.step;
  const NamedTensors rng = random_stream_states(rank_, step_.device());
  CheckpointContents contents;
  if (distributed()) {
    // Every rank writes its share of the model and its slices of the optimizer state.
    const int64_t world = mesh_->world_size();
    const bool lead = rank_ == 0;
    contents.model_shards = world;
    if (lead) prepare_checkpoint_dir(dir, step);
    mesh_->world().barrier();
    // checkpoint.gather: ranks > 0 write on their own disk and send the files to rank 0.
    const std::string partial = partial_checkpoint_dir(dir, step);
    const std::string mine = c.checkpoint.gather && !lead ? gather_staging_dir(run_dir_, rank_) : partial;
    if (mine != partial) {
      fs::remove_all(mine);
      fs::create_directories(mine);
    }
    write_model_shard(mine, rank_, world, step_.model_state_shard());
    fault::point("checkpoint.write");
    std::vector<TensorSlice> slices = step_.training_state_slices();
    for (const auto& [name, state] : rng) slices.push_back({name, state, Region::whole(state.sizes().vec())});
    write_optimizer_shard(mine, rank_, world, slices);
    if (compressing()) write_compression_state(mine, rank_, world, step_.compression_state());
    if (c.checkpoint.gather) gather_checkpoint_files(mesh_->world(), mine, partial);
    mesh_->world().barrier();
    if (!lead) return "";
  }
  contents.meta = meta(position);
  if (compressing()) contents.compression_ranks = mesh_->world_size();
  for (const char* name : kTokenizerFiles) {
    const fs::path file = fs::path(c.data.path) / name;
    if (fs::exists(file)) contents.extra_files.push_back(file.string());
  }
  contents.extra_texts = carried_files_;
  if (!distributed()) {
    contents.model = step_.model_state();
    contents.optimizer = step_.training_state();
    contents.optimizer.insert(contents.optimizer.end(), rng.begin(), rng.end());
    if (collaboration_)
      for (auto& entry : collaboration_->checkpoint_tensors()) contents.optimizer.push_back(std::move(entry));
  }
  const std::string saved =
      distributed() ? commit_checkpoint(dir, step, contents, mesh_->world_size()) : save_checkpoint(dir, step, contents);
  prune_checkpoints(dir, c.checkpoint.keep);
  return saved;
}

// A save that fails (a full disk, a rank lost while saving) leaves no partial directory behind
// and says which checkpoint the run can still resume from. The lead removes the directory
// (remove_partial_checkpoint_dir: moved aside first, as the others may still be creating files in
// it; their writes then fail on their own, not before the lead's, so the first error the launcher
// reports is the real one); a lead killed outright leaves it to the next start
// (remove_interrupted_saves).
std::string RunCheckpoints::save(const RunPosition& position) {
  const bool lead = rank_ == 0;
  try {
    const std::string saved = write(position);
    if (lead) last_ = saved;
    return saved;
  } catch (const std::exception& e) {
    const std::string partial = partial_checkpoint_dir(checkpoints_dir(), position.step);
    const std::string kept = lead ? remove_partial_checkpoint_dir(partial) : "";
    std::string resumable = "no complete checkpoint exists yet";
    try {
      resumable = "the last complete checkpoint is " + resolve_checkpoint_dir(checkpoints_dir());
    } catch (const std::exception&) {  // `latest` names nothing complete: the default stands
    }
    const std::string cleanup = !lead           ? ""
                                : kept.empty() ? "removed its partial directory " + partial + "; "
                                               : "could not remove its partial directory " + partial + " (" + kept + "); ";
    fail("checkpoint of step ", position.step, " not saved: ", e.what(), "; ", cleanup, resumable);
  }
}

}  // namespace tessera
