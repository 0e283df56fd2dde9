// load_tokenizer: reads a directory's tokenizer.json (tessera's or Hugging Face's) and builds the
// tokenizer it describes.
#include "data/tokenizer.h"

#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fs.h"
#include "data/gpt2_bpe.h"
#include "data/hf_tokenizer.h"

namespace tessera {

Tokenizer::~Tokenizer() = default;

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& dir) {
  const std::string path = dir + "/tokenizer.json";
  require(std::filesystem::exists(path) || !std::filesystem::is_regular_file(dir + "/tokenizer.model"), dir,
          ": holds a SentencePiece tokenizer.model and no tokenizer.json; SentencePiece tokenizers (Llama 2, "
          "Mistral) are not read yet");
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(read_file(path));
  } catch (const nlohmann::json::exception& e) {
    fail(path, ": not valid JSON (", e.what(), ")");
  }
  if (is_hf_tokenizer_json(json)) return load_hf_tokenizer(path, json);
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
  fail(path, ": key 'type' must be \"byte\" or \"gpt2\" (got \"", type,
       "\"), or the file Hugging Face's tokenizer.json (with a \"model\" object)");
}

}  // namespace tessera
