// prepare_data on a few KB of the bundled corpus: split sizes add up, val is the tail, the token
// files decode back to the text, no temporary file is left; unigram_entropy against exact values.
#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "data/prepare.h"
#include "data/tokenizer.h"
#include "test_util.h"

namespace tessera {
namespace {

std::vector<int64_t> all_tokens(const TokenFile& file) {
  at::Tensor t = file.window(0, file.size());
  return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
}

// The first 4000 bytes of the corpus, written as two input files.
PrepareOptions corpus_excerpt(const std::string& dir, std::string& text) {
  text = read_file(test::source_path("data/kjv/genesis_to_ruth.txt")).substr(0, 4000);
  write_file_durable(dir + "/part1.txt", text.substr(0, 1500));
  write_file_durable(dir + "/part2.txt", text.substr(1500));
  PrepareOptions options;
  options.inputs = {dir + "/part1.txt", dir + "/part2.txt"};
  options.out_dir = dir + "/out";
  options.val_fraction = 0.1;
  return options;
}

TEST(Prepare, ByteTokenizerSplitsTheTailAndRoundTrips) {
  std::string dir = test::fresh_dir("prepare_byte"), text;
  PrepareOptions options = corpus_excerpt(dir, text);
  std::ostringstream log;
  PrepareReport report = prepare_data(options, log);
  EXPECT_EQ(report.train_tokens + report.val_tokens, 4000);
  EXPECT_EQ(report.val_tokens, 400);
  EXPECT_EQ(report.vocab_size, 256);
  EXPECT_NE(log.str().find("train 3600 tokens, val 400 tokens"), std::string::npos) << log.str();

  TokenFile train = TokenFile::open(options.out_dir + "/train.bin");
  TokenFile val = TokenFile::open(options.out_dir + "/val.bin");
  EXPECT_EQ(train.size(), 3600);
  EXPECT_EQ(val.size(), 400);
  auto tokenizer = load_tokenizer(options.out_dir);
  EXPECT_EQ(tokenizer->type(), "byte");
  EXPECT_EQ(tokenizer->decode(all_tokens(train)), text.substr(0, 3600));
  EXPECT_EQ(tokenizer->decode(all_tokens(val)), text.substr(3600));
  EXPECT_DOUBLE_EQ(report.unigram_entropy_nats, unigram_entropy(TokenStream({train}, train.path())));
  EXPECT_GT(report.unigram_entropy_nats, 2.0);  // English letters: about 3 nats per byte
  EXPECT_LT(report.unigram_entropy_nats, std::log(256.0));
  std::vector<std::string> written = test::list_dir(options.out_dir);
  std::sort(written.begin(), written.end());
  EXPECT_EQ(written, (std::vector<std::string>{"tokenizer.json", "train.bin", "val.bin"}));
}

TEST(Prepare, Gpt2TokenizerCopiesItsVocabulary) {
  std::string dir = test::fresh_dir("prepare_gpt2"), text;
  PrepareOptions options = corpus_excerpt(dir, text);
  options.tokenizer = "gpt2";
  options.encoder_json = test::golden_path("bpe/encoder.json");
  options.vocab_bpe = test::golden_path("bpe/vocab.bpe");
  std::ostringstream log;
  PrepareReport report = prepare_data(options, log);
  EXPECT_LT(report.train_tokens + report.val_tokens, 4000) << "BPE should compress the text";
  EXPECT_EQ(report.val_tokens, std::llround((report.train_tokens + report.val_tokens) * 0.1));
  auto tokenizer = load_tokenizer(options.out_dir);
  EXPECT_EQ(tokenizer->type(), "gpt2");
  EXPECT_EQ(tokenizer->vocab_size(), report.vocab_size);
  EXPECT_EQ(read_file(options.out_dir + "/vocab.bpe"), read_file(options.vocab_bpe));
  std::string decoded = tokenizer->decode(all_tokens(TokenFile::open(options.out_dir + "/train.bin"))) +
                        tokenizer->decode(all_tokens(TokenFile::open(options.out_dir + "/val.bin")));
  EXPECT_EQ(decoded, text);
}

TEST(Prepare, BadInputsAreNamed) {
  std::string dir = test::fresh_dir("prepare_bad"), text;
  PrepareOptions options = corpus_excerpt(dir, text);
  options.inputs.push_back(dir + "/absent.txt");
  std::ostringstream log;
  EXPECT_TRUE(test::throws_naming([&] { prepare_data(options, log); }, {dir + "/absent.txt"}));
  EXPECT_FALSE(test::exists(options.out_dir + "/train.bin"));
  options = corpus_excerpt(dir, text);
  options.val_fraction = 1.0;
  EXPECT_TRUE(test::throws_naming([&] { prepare_data(options, log); }, {"val_fraction"}));
  options.val_fraction = 0.1;
  options.tokenizer = "gpt3";
  EXPECT_TRUE(test::throws_naming([&] { prepare_data(options, log); }, {"gpt3"}));
  options.tokenizer = "gpt2";
  EXPECT_TRUE(test::throws_naming([&] { prepare_data(options, log); }, {"encoder.json"}));
}

TEST(UnigramEntropy, MatchesExactValues) {
  std::string dir = test::fresh_dir("entropy");
  write_token_file(dir + "/two.bin", {0, 1, 1, 0, 0, 1});
  EXPECT_NEAR(unigram_entropy(TokenStream::open(dir, "two.bin")), std::log(2.0), 1e-12);
  write_token_file(dir + "/three.bin", {7, 7, 3, 9});  // p = 1/2, 1/4, 1/4
  EXPECT_NEAR(unigram_entropy(TokenStream::open(dir, "three.bin")), 1.5 * std::log(2.0), 1e-12);
  write_token_file(dir + "/one.bin", {5, 5, 5});
  EXPECT_EQ(unigram_entropy(TokenStream::open(dir, "one.bin")), 0.0);
}

}  // namespace
}  // namespace tessera
