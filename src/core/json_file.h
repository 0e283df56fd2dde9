// Reading JSON (a file, or text read from one) with an error that names its source.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fs.h"

namespace tessera {

// `text` parsed; throws tessera::Error "<source>: malformed JSON (...)".
inline nlohmann::json parse_json(const std::string& text, const std::string& source) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail(source, ": malformed JSON (", e.what(), ")");
  }
}

// The parsed contents of `path`; throws tessera::Error "<path>: malformed JSON (...)" or the
// read error naming the path.
inline nlohmann::json read_json_file(const std::string& path) { return parse_json(read_file(path), path); }

}  // namespace tessera
