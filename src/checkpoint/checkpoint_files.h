// How a checkpoint lies on disk: the names of its files and of the step directories, the
// checksum of its meta.json, and the listing of a run's step directories. Internal to checkpoint/:
// shared by the writer (checkpoint.cpp) and the reader (checkpoint_read.cpp); everything else goes
// through checkpoint.h.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace tessera::checkpoint_files {

inline constexpr const char* kModelFile = "model.safetensors";
inline constexpr const char* kOptimizerFile = "optimizer.safetensors";
inline constexpr const char* kMetaFile = "meta.json";
inline constexpr const char* kModelIndex = "model.safetensors.index.json";

// "step_<N>".
std::string step_name(int64_t step);
// "optimizer-<rank>-of-<shards>.safetensors".
std::string shard_name(int64_t rank, int64_t shards);
// Hugging Face's sharded-model convention: model-00001-of-00004.safetensors (1-based).
std::string model_shard_name(int64_t rank, int64_t shards);
// "compression-<rank>-of-<ranks>.safetensors".
std::string compression_name(int64_t rank, int64_t ranks);
// The checksum meta.json carries of itself (its "meta_checksum" left out).
std::string meta_checksum(nlohmann::json meta);
// Step directories under `checkpoints_dir` (step_<N>, complete or not), oldest first.
std::vector<std::pair<int64_t, std::filesystem::path>> step_dirs(const std::filesystem::path& checkpoints_dir);

}  // namespace tessera::checkpoint_files
