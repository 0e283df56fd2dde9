// Writing the run's checkpoints (trainer_state.h): the whole state from one process, or every
// rank's shards into one partial directory committed by rank 0, with what a resume needs to go on
// exactly (the data position, the random streams, the compressors', the collaboration's state).
#include <filesystem>

#include <torch/torch.h>

#include "checkpoint/checkpoint.h"
#include "core/error.h"
#include "core/fault_injection.h"
#include "core/random_streams.h"
#include "data/tokenizer.h"
#include "train/checkpoint_transfer.h"
#include "train/trainer_state.h"

namespace tessera {
namespace fs = std::filesystem;
namespace {

// This rank's random stream states as checkpoint entries (trainer_state.h).
NamedTensors random_stream_states(int64_t rank, const at::Device& device) {
  NamedTensors out;
  for (auto& [name, state] : random::states(device.is_cuda() ? std::optional<at::Device>(device) : std::nullopt))
    out.emplace_back(random_state_prefix(rank) + name, std::move(state));
  return out;
}

}  // namespace

std::string random_state_prefix(int64_t rank) { return "rng.rank" + std::to_string(rank) + "."; }

bool is_random_state(const std::string& name) { return name.rfind("rng.rank", 0) == 0; }

void Trainer::State::write_checkpoint(Progress& progress) {
  const Config& c = config;
  const std::string dir = checkpoints_dir();
  CheckpointContents contents;
  const NamedTensors rng = random_stream_states(rank, device);
  if (distributed) {
    // Every rank writes its share of the model and its slices of the optimizer state.
    const int64_t world = mesh->world_size();
    contents.model_shards = world;
    if (lead) prepare_checkpoint_dir(dir, step);
    mesh->world().barrier();
    // checkpoint.gather: ranks > 0 write on their own disk and send the files to rank 0.
    const std::string partial = partial_checkpoint_dir(dir, step);
    const std::string mine = c.checkpoint.gather && !lead ? gather_staging_dir(run_dir, rank) : partial;
    if (mine != partial) {
      fs::remove_all(mine);
      fs::create_directories(mine);
    }
    write_model_shard(mine, rank, world, trainer->model_state_shard());
    fault::point("checkpoint.write");
    std::vector<TensorSlice> slices = trainer->training_state_slices();
    for (const auto& [name, state] : rng) slices.push_back({name, state, Region::whole(state.sizes().vec())});
    write_optimizer_shard(mine, rank, world, slices);
    if (compressing()) write_compression_state(mine, rank, world, trainer->compression_state());
    if (c.checkpoint.gather) gather_checkpoint_files(mesh->world(), mine, partial);
    mesh->world().barrier();
    if (!lead) return;
  }
  contents.meta = {{"config", c.to_toml_string()},
                   {"data",
                    {{"path", c.data.path},
                     {"seed", c.data.seed},
                     {"position", sampler->position()},
                     {"global_batch", sampler->global_batch()},
                     {"train", data->train.manifest()}}},
                   {"tokens_seen", tokens_seen},
                   {"elapsed_s", elapsed_s()},
                   {"torch_version", TORCH_VERSION},
                   {"grad_compression", compressing() ? c.parallel.grad_compression : "none"}};
  if (collaboration) contents.meta["collaboration"] = collaboration->checkpoint_state();
  if (compressing()) contents.compression_ranks = mesh->world_size();
  for (const char* name : kTokenizerFiles) {
    fs::path file = fs::path(c.data.path) / name;
    if (fs::exists(file)) contents.extra_files.push_back(file.string());
  }
  contents.extra_texts = carried_files;
  if (!distributed) {
    contents.model = trainer->model_state();
    contents.optimizer = trainer->training_state();
    contents.optimizer.insert(contents.optimizer.end(), rng.begin(), rng.end());
    if (collaboration)
      for (auto& entry : collaboration->checkpoint_tensors()) contents.optimizer.push_back(std::move(entry));
  }
  last_checkpoint = distributed ? commit_checkpoint(dir, step, contents, mesh->world_size())
                                : save_checkpoint(dir, step, contents);
  prune_checkpoints(dir, c.checkpoint.keep);
  progress.message("checkpoint: " + last_checkpoint);
}

// A save that fails (a full disk, a rank lost while saving) leaves no partial directory behind
// and says which checkpoint the run can still resume from. The lead removes the directory (the
// others' writes into it then fail on their own, not before the lead's, so the first error the
// launcher reports is the real one); a lead killed outright leaves it to the next start
// (remove_interrupted_saves).
void Trainer::State::save(Progress& progress) {
  try {
    write_checkpoint(progress);
  } catch (const std::exception& e) {
    const std::string partial = partial_checkpoint_dir(checkpoints_dir(), step);
    std::error_code ignored;
    if (lead) fs::remove_all(partial, ignored);
    std::string resumable = "no complete checkpoint exists yet";
    try {
      resumable = "the last complete checkpoint is " + resolve_checkpoint_dir(checkpoints_dir());
    } catch (const std::exception&) {  // `latest` names nothing complete: the default stands
    }
    fail("checkpoint of step ", step, " not saved: ", e.what(), lead ? "; removed its partial directory " : "; ",
         lead ? partial + "; " : "", resumable);
  }
}

}  // namespace tessera
