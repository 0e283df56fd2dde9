// load_tokenizer: reads a directory's tokenizer.json (tessera's or Hugging Face's) or
// tokenizer.model and builds the tokenizer it describes.
#include "data/tokenizer.h"

#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fs.h"
#include "data/gpt2_bpe.h"
#include "data/hf_tokenizer.h"
#include "data/sentencepiece.h"

namespace tessera {

Tokenizer::~Tokenizer() = default;

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& dir) {
  const std::string path = dir + "/tokenizer.json";
  if (!std::filesystem::exists(path) && std::filesystem::is_regular_file(dir + "/tokenizer.model"))
    return load_sentencepiece(dir + "/tokenizer.model");
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(read_file(path));
  } catch (const nlohmann::json::exception& e) {
    fail(path, ": not valid JSON (", e.what(), ")");
  }
  if (is_hf_tokenizer_json(json)) {
    // A tokenizer.json converted from SentencePiece (Llama 2, Mistral) is read through its model.
    if (is_sentencepiece_conversion(json)) {
      require(std::filesystem::is_regular_file(dir + "/tokenizer.model"), path,
              ": a tokenizer converted from SentencePiece (byte_fallback or Metaspace); tessera reads it from the "
              "tokenizer.model beside it, and ", dir, "/tokenizer.model is missing");
      return load_sentencepiece(dir + "/tokenizer.model");
    }
    return load_hf_tokenizer(path, json);
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
  if (type == "sentencepiece") return load_sentencepiece(dir + "/" + string_key("model"));
  fail(path, ": key 'type' must be \"byte\", \"gpt2\" or \"sentencepiece\" (got \"", type,
       "\"), or the file Hugging Face's tokenizer.json (with a \"model\" object)");
}

}  // namespace tessera
