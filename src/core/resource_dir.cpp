#include "core/resource_dir.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>

namespace tessera {

std::vector<std::string> resource_search_path(const char* env, const std::string& folder) {
  namespace fs = std::filesystem;
  std::vector<std::string> dirs;
  if (const char* value = std::getenv(env); value && *value) dirs.emplace_back(value);
  std::error_code error;
  const fs::path bin = fs::read_symlink("/proc/self/exe", error).parent_path();
  if (!error)
    for (const fs::path& dir : {bin / folder, bin.parent_path() / folder, bin.parent_path() / "share/tessera" / folder})
      dirs.push_back(dir.string());
  return dirs;
}

std::string resource_dir(const char* env, const std::string& folder) {
  for (const std::string& dir : resource_search_path(env, folder))
    if (std::filesystem::is_directory(dir)) return dir;
  return {};
}

std::vector<std::string> resource_toml_names(const char* env, const std::string& folder) {
  std::vector<std::string> names;
  const std::string dir = resource_dir(env, folder);
  if (!dir.empty())
    for (const auto& entry : std::filesystem::directory_iterator(dir))
      if (entry.path().extension() == ".toml") names.push_back(entry.path().stem().string());
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace tessera
