// How a checkpoint lies on disk (checkpoint_files.h).
#include "checkpoint/checkpoint_files.h"

#include <algorithm>
#include <cctype>
#include <cstdio>

#include "core/fs.h"

namespace tessera::checkpoint_files {
namespace fs = std::filesystem;

std::string step_name(int64_t step) { return "step_" + std::to_string(step); }

std::string shard_name(int64_t rank, int64_t shards) {
  return "optimizer-" + std::to_string(rank) + "-of-" + std::to_string(shards) + ".safetensors";
}

std::string model_shard_name(int64_t rank, int64_t shards) {
  char name[64];
  std::snprintf(name, sizeof name, "model-%05lld-of-%05lld.safetensors", static_cast<long long>(rank + 1),
                static_cast<long long>(shards));
  return name;
}

std::string compression_name(int64_t rank, int64_t ranks) {
  return "compression-" + std::to_string(rank) + "-of-" + std::to_string(ranks) + ".safetensors";
}

std::string meta_checksum(nlohmann::json meta) {
  meta.erase("meta_checksum");
  return checksum(meta.dump());
}

std::vector<std::pair<int64_t, fs::path>> step_dirs(const fs::path& checkpoints_dir) {
  std::vector<std::pair<int64_t, fs::path>> out;
  if (!fs::is_directory(checkpoints_dir)) return out;
  for (const auto& entry : fs::directory_iterator(checkpoints_dir)) {
    std::string name = entry.path().filename().string();
    if (!entry.is_directory() || name.rfind("step_", 0) != 0) continue;
    std::string digits = name.substr(5);
    if (digits.empty() || !std::all_of(digits.begin(), digits.end(), ::isdigit)) continue;
    out.emplace_back(std::stoll(digits), entry.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace tessera::checkpoint_files
