// Reading a JSON file with an error that names it.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fs.h"

namespace tessera {

// The parsed contents of `path`; throws tessera::Error "<path>: malformed JSON (...)" or the
// read error naming the path.
inline nlohmann::json read_json_file(const std::string& path) {
  try {
    return nlohmann::json::parse(read_file(path));
  } catch (const nlohmann::json::exception& e) {
    fail(path, ": malformed JSON (", e.what(), ")");
  }
}

}  // namespace tessera
