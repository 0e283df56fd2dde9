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
namespace {


}  // namespace

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
  nlohmann::json description;
  if (options.tokenizer == "byte") {
    tokenizer = make_byte_tokenizer();
    description = {{"type", "byte"}};
  } else if (options.tokenizer == "gpt2") {
    require(!options.encoder_json.empty() && !options.vocab_bpe.empty(),
            "prepare: the gpt2 tokenizer needs encoder.json and vocab.bpe paths");
    tokenizer = std::make_unique<Gpt2Bpe>(options.encoder_json, options.vocab_bpe);
    description = {{"type", "gpt2"},
                   {"vocab_size", tokenizer->vocab_size()},
                   {"encoder", "encoder.json"},
                   {"merges", "vocab.bpe"}};
  } else {
    fail("prepare: tokenizer must be byte or gpt2 (got '", options.tokenizer, "')");
  }
  require(tokenizer->vocab_size() <= 65536, "prepare: vocab size ", tokenizer->vocab_size(),
          " does not fit the uint16 tokens of llm.c files");

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
  if (options.tokenizer == "gpt2") {
    write_file_atomic(options.out_dir + "/encoder.json", read_file(options.encoder_json));
    write_file_atomic(options.out_dir + "/vocab.bpe", read_file(options.vocab_bpe));
  }
  write_file_atomic(options.out_dir + "/tokenizer.json", description.dump(2) + "\n");

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
