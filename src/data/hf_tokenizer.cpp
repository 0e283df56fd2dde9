// Hugging Face's tokenizer.json read into the byte-level BPE (hf_tokenizer.h).
#include "data/hf_tokenizer.h"

#include "core/error.h"
#include "data/byte_level_bpe.h"
#include "data/gpt2_bpe.h"
#include "data/regex_split.h"

namespace tessera {
namespace {

using json = nlohmann::json;

std::string type_of(const json& node) {
  return node.is_object() && node.contains("type") && node["type"].is_string() ? node["type"].get<std::string>() : "";
}

bool flag(const json& node, const char* key) { return node.contains(key) && node[key].is_boolean() && node[key].get<bool>(); }

// One pre-tokenizer step applied to every piece of the previous ones.
using Step = ByteLevelBpe::Split;

Step pre_tokenizer_step(const json& node, const std::string& where) {
  const std::string type = type_of(node);
  if (type == "ByteLevel") {
    require(!flag(node, "add_prefix_space"), where, ": ByteLevel with add_prefix_space = true is not read "
            "(tessera encodes the text as it is)");
    if (node.contains("use_regex") && node["use_regex"].is_boolean() && !node["use_regex"].get<bool>())
      return [](const std::string& text) { return std::vector<std::string>{text}; };
    return gpt2_pretokenize;
  }
  if (type == "Split") {
    const std::string behavior = node.value("behavior", "");
    require(behavior == "Isolated", where, ": Split with behavior '", behavior,
            "' is not read (tessera keeps each match as a piece: Isolated)");
    require(!flag(node, "invert"), where, ": Split with invert = true is not read");
    require(node.contains("pattern") && node["pattern"].is_object(), where, ": Split has no 'pattern' object");
    const json& pattern = node["pattern"];
    std::string regex;
    if (pattern.contains("Regex") && pattern["Regex"].is_string()) {
      regex = pattern["Regex"].get<std::string>();
    } else if (pattern.contains("String") && pattern["String"].is_string()) {
      regex = "\\Q" + pattern["String"].get<std::string>() + "\\E";  // literal
    } else {
      fail(where, ": Split's 'pattern' has neither 'Regex' nor 'String'");
    }
    const auto split = std::make_shared<RegexSplit>(regex, where);
    return [split](const std::string& text) { return (*split)(text); };
  }
  fail(where, ": pre-tokenizer '", type, "' is not read (tessera reads Split, ByteLevel and a Sequence of them)");
}

}  // namespace

bool is_hf_tokenizer_json(const json& json) { return json.is_object() && json.contains("model") && json["model"].is_object(); }

bool is_sentencepiece_conversion(const json& root) {
  const json& model = root["model"];
  return flag(model, "byte_fallback") || type_of(model) == "Unigram" ||
         type_of(root.value("pre_tokenizer", json())) == "Metaspace";
}

std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::string& path, const json& root) {
  const json& model = root["model"];
  const std::string model_type = type_of(model);
  require(!is_sentencepiece_conversion(root), path, ": internal: a SentencePiece conversion is read from its model");
  require(model_type == "BPE", path, ": model.type '", model_type, "' is not read (tessera reads byte-level BPE)");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix", "dropout"})
    require(!model.contains(key) || model[key].is_null() || (model[key].is_string() && model[key].get<std::string>().empty()),
            path, ": model.", key, " is set; tessera's byte-level BPE has none");

  ByteLevelBpe::Spec spec;
  spec.source = path;
  spec.type = "hf_bpe";
  spec.ignore_merges = flag(model, "ignore_merges");
  require(model.contains("vocab") && model["vocab"].is_object(), path, ": model.vocab is not an object");
  for (const auto& [symbol, id] : model["vocab"].items()) {
    require(id.is_number_integer(), path, ": model.vocab['", symbol, "'] is not an integer id");
    spec.vocabulary.emplace_back(byte_level_bytes(symbol, path + ": model.vocab"), id.get<int64_t>());
  }
  require(model.contains("merges") && model["merges"].is_array(), path, ": model.merges is not an array");
  for (const json& merge : model["merges"]) {
    std::string a, b;
    if (merge.is_string()) {
      const std::string text = merge.get<std::string>();
      const size_t space = text.find(' ');
      require(space != std::string::npos && text.find(' ', space + 1) == std::string::npos, path, ": merge '", text,
              "' is not two symbols separated by one space");
      a = text.substr(0, space);
      b = text.substr(space + 1);
    } else {
      require(merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string(), path,
              ": a merge is neither \"a b\" nor [\"a\", \"b\"]: ", merge.dump());
      a = merge[0].get<std::string>();
      b = merge[1].get<std::string>();
    }
    spec.merges.emplace_back(byte_level_bytes(a, path + ": model.merges"), byte_level_bytes(b, path + ": model.merges"));
  }
  if (root.contains("added_tokens") && root["added_tokens"].is_array())
    for (const json& token : root["added_tokens"]) {
      require(token.contains("content") && token["content"].is_string() && token.contains("id") &&
                  token["id"].is_number_integer(),
              path, ": an added token lacks 'content' or 'id': ", token.dump());
      const std::string content = token["content"].get<std::string>();
      for (const char* key : {"lstrip", "rstrip", "single_word"})
        require(!flag(token, key), path, ": added token '", content, "' has ", key,
                " = true (tessera matches added tokens exactly as written)");
      spec.added.emplace_back(content, token["id"].get<int64_t>());
    }

  const json normalizer = root.value("normalizer", json());
  const std::string normalizer_type = type_of(normalizer);
  require(normalizer.is_null() || normalizer_type == "NFC", path, ": normalizer '", normalizer_type,
          "' is not read (tessera reads none or NFC)");
  if (normalizer_type == "NFC") spec.normalize = nfc_normalize;

  const json pre = root.value("pre_tokenizer", json());
  std::vector<Step> steps;
  if (type_of(pre) == "Sequence") {
    require(pre.contains("pretokenizers") && pre["pretokenizers"].is_array(), path,
            ": a Sequence pre-tokenizer without 'pretokenizers'");
    for (const json& step : pre["pretokenizers"]) steps.push_back(pre_tokenizer_step(step, path + ": pre_tokenizer"));
  } else if (!pre.is_null()) {
    steps.push_back(pre_tokenizer_step(pre, path + ": pre_tokenizer"));
  }
  const std::string decoder = type_of(root.value("decoder", json()));
  require(decoder.empty() || decoder == "ByteLevel", path, ": decoder '", decoder,
          "' is not read (a byte-level BPE decodes with ByteLevel)");
  spec.pretokenize = [steps](const std::string& text) {
    std::vector<std::string> pieces = {text};
    for (const Step& step : steps) {
      std::vector<std::string> next;
      for (const std::string& piece : pieces)
        for (std::string& part : step(piece)) next.push_back(std::move(part));
      pieces = std::move(next);
    }
    return pieces;
  };
  return std::make_unique<ByteLevelBpe>(std::move(spec));
}

}  // namespace tessera
