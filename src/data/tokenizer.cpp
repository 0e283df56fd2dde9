// load_tokenizer: reads a data directory's tokenizer.json and builds the tokenizer it names.
#include "data/tokenizer.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fs.h"
#include "data/gpt2_bpe.h"

namespace tessera {

Tokenizer::~Tokenizer() = default;

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& dir) {
  const std::string path = dir + "/tokenizer.json";
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(read_file(path));
  } catch (const nlohmann::json::exception& e) {
    fail(path, ": not valid JSON (", e.what(), ")");
  }
  auto string_key = [&](const char* key) {
    require(json.is_object() && json.contains(key) && json[key].is_string(), path, ": missing string key '", key,
            "'");
    return json[key].get<std::string>();
  };
  std::string type = string_key("type");
  if (type == "byte") return make_byte_tokenizer();
  if (type == "gpt2") {
    require(json.contains("vocab_size") && json["vocab_size"].is_number_integer(), path,
            ": missing integer key 'vocab_size'");
    return std::make_unique<Gpt2Bpe>(dir + "/" + string_key("encoder"), dir + "/" + string_key("merges"),
                                     json["vocab_size"].get<int64_t>());
  }
  fail(path, ": key 'type' must be \"byte\" or \"gpt2\" (got \"", type, "\")");
}

}  // namespace tessera
