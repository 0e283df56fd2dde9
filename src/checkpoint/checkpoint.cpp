// Writing checkpoints (checkpoint.h): the step's partial directory, each rank's shards, the
// atomic commit, and the clean-up of interrupted saves and old steps. Reading is in
// checkpoint_read.cpp, the files' names in checkpoint_files.h.
#include "checkpoint/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <set>

#include <ATen/ATen.h>

#include "checkpoint/checkpoint_files.h"
#include "core/error.h"
#include "core/fault_injection.h"
#include "core/fs.h"
#include "core/json_file.h"

namespace tessera {
namespace fs = std::filesystem;

std::string partial_checkpoint_dir(const std::string& checkpoints_dir, int64_t step) {
  return (fs::path(checkpoints_dir) / (checkpoint_files::step_name(step) + ".partial")).string();
}

std::string prepare_checkpoint_dir(const std::string& checkpoints_dir, int64_t step) {
  fs::create_directories(checkpoints_dir);
  const std::string partial = partial_checkpoint_dir(checkpoints_dir, step);
  fs::remove_all(partial);
  fs::create_directories(partial);
  return partial;
}

std::string remove_partial_checkpoint_dir(const std::string& partial) {
  const fs::path aside = fs::path(partial).parent_path() / (fs::path(partial).stem().string() + ".failed.partial");
  std::error_code error;
  fs::remove_all(aside, error);
  fs::rename(partial, aside, error);
  fs::remove_all(error ? fs::path(partial) : aside, error);
  if (!fs::exists(partial) && !fs::exists(aside)) return "";
  return error ? error.message() : "it is still there";
}

std::vector<TensorSlice> even_slices(const NamedTensors& whole, int64_t rank, int64_t shards) {
  std::vector<TensorSlice> out;
  for (const auto& [name, t] : whole) {
    const int64_t n = t.numel(), per_rank = (n + shards - 1) / shards;
    const int64_t begin = std::min(n, rank * per_rank), end = std::min(n, begin + per_rank);
    if (end > begin) out.push_back({name, t.reshape({-1}).narrow(0, begin, end - begin), Region::range(t.sizes().vec(), begin, end)});
  }
  return out;
}

void write_optimizer_shard(const std::string& partial_dir, int64_t rank, int64_t shards,
                           const std::vector<TensorSlice>& slices) {
  NamedTensors tensors;
  std::map<std::string, std::string> records;
  for (const TensorSlice& slice : slices) {
    require(records.count(slice.name) == 0, "internal: two slices of '", slice.name, "' in rank ", rank,
            "'s optimizer shard");
    require(slice.values.numel() == slice.region.numel(), "internal: the slice of '", slice.name, "' holds ",
            slice.values.numel(), " elements, its region ", slice.region.numel());
    tensors.emplace_back(slice.name, slice.values.reshape({-1}).contiguous());
    records[slice.name] = slice.region.record();
  }
  write_safetensors((fs::path(partial_dir) / checkpoint_files::shard_name(rank, shards)).string(), tensors, records);
}

void write_model_shard(const std::string& partial_dir, int64_t rank, int64_t shards,
                       const std::vector<TensorSlice>& tensors) {
  NamedTensors values;
  std::map<std::string, std::string> metadata{{"format", "pt"}};
  for (const TensorSlice& t : tensors) {
    require(t.values.numel() == t.region.numel(), "internal: the part of '", t.name, "' holds ", t.values.numel(),
            " elements, its region ", t.region.numel());
    values.emplace_back(t.name, t.values);
    if (!t.region.is_whole()) metadata[t.name] = t.region.record();
  }
  write_safetensors((fs::path(partial_dir) / checkpoint_files::model_shard_name(rank, shards)).string(), values, metadata);
}

void write_compression_state(const std::string& partial_dir, int64_t rank, int64_t ranks, const NamedTensors& state) {
  write_safetensors((fs::path(partial_dir) / checkpoint_files::compression_name(rank, ranks)).string(), state);
}

std::string save_checkpoint(const std::string& checkpoints_dir, int64_t step, const CheckpointContents& contents) {
  return commit_checkpoint(checkpoints_dir, step, contents, 0);
}

std::string commit_checkpoint(const std::string& checkpoints_dir, int64_t step, const CheckpointContents& contents,
                              int64_t shards) {
  const fs::path final_dir = fs::path(checkpoints_dir) / checkpoint_files::step_name(step);
  const bool written_in_parts = shards > 0 || contents.model_shards > 0;
  const fs::path partial = written_in_parts ? fs::path(partial_checkpoint_dir(checkpoints_dir, step))
                                            : fs::path(prepare_checkpoint_dir(checkpoints_dir, step));
  for (int64_t r = 0; r < shards; ++r)
    require(fs::exists(partial / checkpoint_files::shard_name(r, shards)), (partial / checkpoint_files::shard_name(r, shards)).string(),
            ": missing when committing the checkpoint (did rank ", r, " fail?)");
  for (int64_t r = 0; r < contents.compression_ranks; ++r)
    require(fs::exists(partial / checkpoint_files::compression_name(r, contents.compression_ranks)),
            (partial / checkpoint_files::compression_name(r, contents.compression_ranks)).string(),
            ": missing when committing the checkpoint (did rank ", r, " fail?)");

  if (contents.model_shards > 0) {
    // The index in Hugging Face's format, from the shards' headers (no tensor is read).
    nlohmann::json weight_map = nlohmann::json::object(), part_map = nlohmann::json::object();
    int64_t total = 0;
    for (int64_t r = 0; r < contents.model_shards; ++r) {
      const fs::path file = partial / checkpoint_files::model_shard_name(r, contents.model_shards);
      require(fs::exists(file), file.string(), ": missing when committing the checkpoint (did rank ", r, " fail?)");
      const SafetensorsHeader header = read_safetensors_header(file.string());
      for (const auto& [name, e] : header.tensors) {
        require(!weight_map.contains(name), "internal: '", name, "' written by two ranks");
        if (header.metadata.count(name)) {
          part_map[name].push_back(file.filename().string());
        } else {
          require(!part_map.contains(name), "internal: '", name, "' written whole and in parts");
          weight_map[name] = file.filename().string();
        }
        total += e.bytes;
      }
    }
    nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    if (!part_map.empty()) index["part_map"] = part_map;
    write_file_durable((partial / checkpoint_files::kModelIndex).string(), index.dump(2) + "\n");
  } else {
    write_safetensors((partial / checkpoint_files::kModelFile).string(), contents.model, {{"format", "pt"}});
  }
  fault::point("checkpoint.write");
  if (shards == 0) write_safetensors((partial / checkpoint_files::kOptimizerFile).string(), contents.optimizer);
  for (const auto& file : contents.extra_files) {
    fs::path target = partial / fs::path(file).filename();
    write_file_durable(target.string(), read_file(file));
  }
  for (const auto& [name, bytes] : contents.extra_texts) write_file_durable((partial / name).string(), bytes);

  nlohmann::json meta = contents.meta;
  meta["format_version"] = kCheckpointFormatVersion;
  meta["step"] = step;
  if (shards > 0) meta["optimizer_shards"] = shards;
  if (contents.model_shards > 0) meta["model_shards"] = contents.model_shards;
  if (contents.compression_ranks > 0) meta["compression_ranks"] = contents.compression_ranks;
  nlohmann::json files = nlohmann::json::object();
  for (const auto& entry : fs::directory_iterator(partial)) {
    std::string name = entry.path().filename().string();
    files[name] = {{"bytes", fs::file_size(entry.path())}, {"checksum", file_checksum(entry.path().string())}};
  }
  meta["files"] = files;
  meta["meta_checksum"] = checkpoint_files::meta_checksum(meta);
  write_file_durable((partial / checkpoint_files::kMetaFile).string(), meta.dump(2) + "\n");
  fsync_directory(partial.string());

  // Never a moment without a complete checkpoint for this step: the old one moves aside first.
  const fs::path replaced = fs::path(checkpoints_dir) / (checkpoint_files::step_name(step) + ".replaced");
  bool had_old = fs::exists(final_dir);
  if (had_old) {
    fs::remove_all(replaced);
    fs::rename(final_dir, replaced);
  }
  fs::rename(partial, final_dir);
  fsync_directory(checkpoints_dir);
  write_file_atomic((fs::path(checkpoints_dir) / "latest").string(), checkpoint_files::step_name(step) + "\n");
  if (had_old) fs::remove_all(replaced);
  return final_dir.string();
}

std::vector<std::string> remove_interrupted_saves(const std::string& checkpoints_dir) {
  std::vector<std::string> removed;
  if (!fs::is_directory(checkpoints_dir)) return removed;
  for (const auto& entry : fs::directory_iterator(checkpoints_dir)) {
    const std::string name = entry.path().filename().string();
    const auto ends_with = [&](const std::string& suffix) {
      return name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
    };
    if (!entry.is_directory() || name.rfind("step_", 0) != 0) continue;
    const bool partial = ends_with(".partial");
    const bool replaced = ends_with(".replaced") &&
                          fs::exists(entry.path().parent_path() / (name.substr(0, name.size() - 9) + "/" + checkpoint_files::kMetaFile));
    if (partial || replaced) removed.push_back(name);
  }
  std::sort(removed.begin(), removed.end());
  for (const std::string& name : removed) fs::remove_all(fs::path(checkpoints_dir) / name);
  return removed;
}

void prune_checkpoints(const std::string& checkpoints_dir, int64_t keep) {
  if (keep <= 0) return;
  auto dirs = checkpoint_files::step_dirs(checkpoints_dir);
  const fs::path latest = resolve_checkpoint_dir(checkpoints_dir);
  for (size_t i = 0; i + static_cast<size_t>(keep) < dirs.size(); ++i)
    if (!fs::equivalent(dirs[i].second, latest)) fs::remove_all(dirs[i].second);
}

}  // namespace tessera
