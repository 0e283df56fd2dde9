// prepare_data and unigram_entropy (see prepare.h). The whole text is held in memory: the corpora
// prepare is meant for are megabytes; larger sets come as llm.c token files made elsewhere.
#include "data/prepare.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fs.h"
#include "data/gpt2_bpe.h"
#include "data/tokenizer.h"

namespace tessera {

PrepareReport prepare_data(const PrepareOptions& options, std::ostream& log) {
  require(!options.inputs.empty(), "prepare: no input files given");
  require(!options.out_dir.empty(), "prepare: no output directory given");
  require(options.val_fraction > 0 && options.val_fraction < 1, "prepare: val_fraction must be in (0, 1) (got ",
          options.val_fraction, ")");

  std::string text;
  for (const std::string& input : options.inputs) {
    require(std::filesystem::is_regular_file(input), input, ": input is missing or not a regular file");
    text += read_file(input);
  }

  std::unique_ptr<Tokenizer> tokenizer;
  std::string description;                      // tokenizer.json, written last
  std::vector<std::pair<std::string, std::string>> files;  // copied beside it: source, name
  if (options.tokenizer == "byte") {
    tokenizer = make_byte_tokenizer();
    description = nlohmann::json{{"type", "byte"}}.dump(2) + "\n";
  } else if (options.tokenizer == "gpt2") {
    require(!options.encoder_json.empty() && !options.vocab_bpe.empty(),
            "prepare: the gpt2 tokenizer needs encoder.json and vocab.bpe paths");
    tokenizer = std::make_unique<Gpt2Bpe>(options.encoder_json, options.vocab_bpe);
    description = nlohmann::json{{"type", "gpt2"},
                                 {"vocab_size", tokenizer->vocab_size()},
                                 {"encoder", "encoder.json"},
                                 {"merges", "vocab.bpe"}}
                      .dump(2) + "\n";
    files = {{options.encoder_json, "encoder.json"}, {options.vocab_bpe, "vocab.bpe"}};
  } else if (options.tokenizer.rfind("hf:", 0) == 0) {
    const std::string dir = options.tokenizer.substr(3);
    tokenizer = load_tokenizer(dir);
    if (tokenizer->type() == "sentencepiece") {
      description = nlohmann::json{{"type", "sentencepiece"}, {"model", "tokenizer.model"}}.dump(2) + "\n";
      files = {{dir + "/tokenizer.model", "tokenizer.model"}};
    } else {
      description = read_file(dir + "/tokenizer.json");
    }
  } else {
    fail("prepare: tokenizer must be byte, gpt2 or hf:DIR (got '", options.tokenizer, "')");
  }

  std::vector<int64_t> tokens = tokenizer->encode(text);
  const int64_t total = static_cast<int64_t>(tokens.size());
  const int64_t val = std::llround(static_cast<double>(total) * options.val_fraction);
  require(val >= 1 && total - val >= 1, "prepare: ", total, " tokens cannot be split with val_fraction ",
          options.val_fraction, " (each split needs at least one token)");

  std::error_code error;
  std::filesystem::create_directories(options.out_dir, error);
  if (error) fail(options.out_dir, ": cannot create directory (", error.message(), ")");
  const std::string train_path = options.out_dir + "/train.bin";
  write_token_file(train_path, std::vector<int64_t>(tokens.begin(), tokens.end() - val));
  write_token_file(options.out_dir + "/val.bin", std::vector<int64_t>(tokens.end() - val, tokens.end()));
  for (const auto& [source, name] : files) write_file_atomic(options.out_dir + "/" + name, read_file(source));
  write_file_atomic(options.out_dir + "/tokenizer.json", description);

  PrepareReport report;
  report.train_tokens = total - val;
  report.val_tokens = val;
  report.vocab_size = tokenizer->vocab_size();
  report.unigram_entropy_nats = unigram_entropy(TokenStream({TokenFile::open(train_path)}, train_path));
  log << "prepare: " << text.size() << " bytes from " << options.inputs.size() << " file(s), "
      << tokenizer->type() << " tokenizer (vocab " << report.vocab_size << ") -> " << options.out_dir << "\n"
      << "  train " << report.train_tokens << " tokens, val " << report.val_tokens << " tokens (last "
      << options.val_fraction * 100 << "%)\n"
      << "  unigram entropy of train: " << report.unigram_entropy_nats
      << " nats/token (the loss a model ignoring context cannot beat)\n";
  return report;
}

double unigram_entropy(const TokenStream& data) {
  std::vector<int64_t> counts(static_cast<size_t>(data.vocab_bound()), 0);
  for (const TokenFile& shard : data.shards())
    for (int64_t i = 0; i < shard.size(); ++i) ++counts[shard[i]];
  const double n = static_cast<double>(data.size());
  double entropy = 0;
  for (int64_t c : counts)
    if (c > 0) entropy -= (c / n) * std::log(c / n);
  return entropy;
}

}  // namespace tessera
