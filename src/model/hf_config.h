// Reading a Hugging Face config.json's fields, each checked for its type, with errors naming the
// file (`source`) and the key: shared by the GPT-2 and the Llama-family imports (hf_gpt2.h,
// hf_llama.h); and the folder's other files that import and export carry unchanged.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_file.h"

namespace tessera {

// The JSON files of a Hugging Face folder that travel with its model unchanged: `tessera import
// --hf` copies those present into the checkpoint and `tessera export --hf` writes them back.
inline constexpr std::array<const char*, 3> kHfCarriedFiles = {"generation_config.json", "tokenizer_config.json",
                                                               "special_tokens_map.json"};

// Those of them in directory `dir` (a folder or a checkpoint) as name and bytes (what
// CheckpointContents::extra_texts writes), each checked to be JSON (the error names the file).
inline std::vector<std::pair<std::string, std::string>> hf_carried_files(const std::string& dir) {
  std::vector<std::pair<std::string, std::string>> files;
  for (const char* name : kHfCarriedFiles) {
    const std::string path = dir + "/" + name;
    if (!std::filesystem::is_regular_file(path)) continue;
    std::string bytes = read_file(path);
    parse_json(bytes, path);
    files.emplace_back(name, std::move(bytes));
  }
  return files;
}

// `key` as a positive integer (required).
inline int64_t hf_int(const nlohmann::json& config, const char* key, const std::string& source) {
  const auto it = config.find(key);
  require(it != config.end() && it->is_number_integer() && it->get<int64_t>() > 0, source, ": '", key,
          "' is missing or not a positive integer");
  return it->get<int64_t>();
}

// `key` as a string, or `fallback` where it is absent or null.
inline std::string hf_string(const nlohmann::json& config, const char* key, const std::string& fallback,
                      const std::string& source) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return fallback;
  require(it->is_string(), source, ": '", key, "' = ", it->dump(), " is not a string");
  return it->get<std::string>();
}

// `key` as a number, or `fallback` where it is absent or null.
inline double hf_number(const nlohmann::json& config, const char* key, double fallback, const std::string& source) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return fallback;
  require(it->is_number(), source, ": '", key, "' = ", it->dump(), " is not a number");
  return it->get<double>();
}

// `key` as a boolean, or `fallback` where it is absent or null.
inline bool hf_bool(const nlohmann::json& config, const char* key, bool fallback, const std::string& source) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return fallback;
  require(it->is_boolean(), source, ": '", key, "' = ", it->dump(), " is not true or false");
  return it->get<bool>();
}

// `key`, when present and not null, must be `wanted`; `why` says what tessera computes instead.
inline void hf_expect(const nlohmann::json& config, const char* key, const nlohmann::json& wanted,
                      const std::string& source, const char* why) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null() || *it == wanted) return;
  fail(source, ": '", key, "' = ", it->dump(), " cannot be imported: ", why, " (", key, " = ", wanted.dump(), ")");
}

}  // namespace tessera
