// Hugging Face tokenizers against transformers, the implementation no one here wrote: three
// byte-level BPE tokenizers trained by the `tokenizers` library with the pre-tokenization of Llama 3
// (its Split regex, ignore_merges), Qwen 2 (its regex, NFC) and GPT-2 (ByteLevel's own regex)
// (tests/hf/make_tokenizer_references.py) are read by tessera (data/hf_tokenizer.h), and tessera's
// ids equal transformers' (and, for a SentencePiece BPE model trained as Llama 2's was, the
// sentencepiece library's: data/sentencepiece.h) on a multilingual text (emoji, CJK, numbers, whitespace runs, special
// tokens, decomposed accents) and on the bundled corpus; `tessera prepare --tokenizer hf:DIR`
// writes those ids. A wrong regex, merge order or byte map moves ids at once.
#include <gtest/gtest.h>

#include <filesystem>
#include <cstring>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/fs.h"
#include "data/prepare.h"
#include "data/tokenizer.h"
#include "data/token_stream.h"
#include "test_util.h"

namespace tessera::test {
namespace {

namespace fs = std::filesystem;

// Built with -DTESSERA_TOKENIZERS=OFF (no PCRE2): a tokenizer whose pre-tokenizer splits by a
// pattern cannot be read, and says so (data/regex_split.h); its tests skip.
bool needs_patterns_without_them(const fs::path& dir) {
  return !TESSERA_TOKENIZERS && read_file((dir / "tokenizer.json").string()).find("\"Split\"") != std::string::npos;
}
constexpr const char* kWithoutPatterns = "built with -DTESSERA_TOKENIZERS=OFF: this tokenizer's pre-tokenizer needs PCRE2";

std::vector<int64_t> corpus_ids(const fs::path& file) {
  const std::string bytes = read_file(file.string());
  std::vector<int64_t> ids(bytes.size() / 4);
  for (size_t i = 0; i < ids.size(); ++i) {
    int32_t id;
    std::memcpy(&id, bytes.data() + 4 * i, 4);
    ids[i] = id;
  }
  return ids;
}

class HfTokenizer : public ::testing::TestWithParam<std::string> {};

TEST_P(HfTokenizer, IdsEqualTransformersOnMultilingualTextAndTheCorpus) {
  const fs::path dir = fs::path(TESSERA_HF_TOKENIZERS) / GetParam();
  if (!fs::exists(dir / "reference.json"))
    GTEST_SKIP() << dir << " has no reference: tests/hf/make_tokenizer_references.py did not run (transformers missing?)";
  if (needs_patterns_without_them(dir)) GTEST_SKIP() << kWithoutPatterns;
  const auto tokenizer = load_tokenizer(dir.string());
  const auto reference = nlohmann::json::parse(read_file((dir / "reference.json").string()));
  EXPECT_EQ(tokenizer->type(), reference["type"].get<std::string>());
  EXPECT_EQ(tokenizer->vocab_size(), 1200);
  for (size_t i = 0; i < reference["texts"].size(); ++i) {
    const std::string text = reference["texts"][i].get<std::string>();
    const auto ids = reference["ids"][i].get<std::vector<int64_t>>();
    EXPECT_EQ(tokenizer->encode(text), ids) << GetParam() << ": text " << i << ": " << text;
    EXPECT_EQ(tokenizer->decode(ids), reference["decoded"][i].get<std::string>()) << GetParam() << ": text " << i;
    if (GetParam() != "qwen2") {  // no normalizer
      EXPECT_EQ(tokenizer->decode(tokenizer->encode(text)), text);
    }
  }
  const std::string corpus = read_file(TESSERA_CORPUS);
  const std::vector<int64_t> expected = corpus_ids(dir / "corpus.ids");
  ASSERT_GT(expected.size(), 100000u);
  EXPECT_EQ(tokenizer->encode(corpus), expected) << GetParam() << ": the bundled corpus";
}

INSTANTIATE_TEST_SUITE_P(Families, HfTokenizer, ::testing::Values("llama3", "qwen2", "gpt2", "sentencepiece"),
                         [](const auto& info) { return info.param; });

// prepare --tokenizer hf:DIR: the token files hold transformers' ids of the corpus (train then
// val, split at the tail), and the data directory's tokenizer.json is the folder's, so training,
// evaluation and generate read the same tokenizer.
TEST(HfTokenizerPrepare, WritesTransformersIdsAndCarriesTheTokenizer) {
  const fs::path dir = fs::path(TESSERA_HF_TOKENIZERS) / "llama3";
  if (!fs::exists(dir / "corpus.ids")) GTEST_SKIP() << dir << " has no reference (transformers missing?)";
  if (needs_patterns_without_them(dir)) GTEST_SKIP() << kWithoutPatterns;
  PrepareOptions options;
  options.inputs = {TESSERA_CORPUS};
  options.out_dir = fresh_dir("hf_prepare");
  options.tokenizer = "hf:" + dir.string();
  std::ostringstream log;
  const PrepareReport report = prepare_data(options, log);
  const std::vector<int64_t> expected = corpus_ids(dir / "corpus.ids");
  EXPECT_EQ(report.train_tokens + report.val_tokens, static_cast<int64_t>(expected.size()));
  std::vector<int64_t> got;
  for (const char* split : {"train.bin", "val.bin"}) {
    const TokenStream stream = TokenStream::open(options.out_dir, split);
    std::vector<int64_t> part(static_cast<size_t>(stream.size()));
    stream.read(0, stream.size(), part.data());
    got.insert(got.end(), part.begin(), part.end());
  }
  EXPECT_EQ(got, expected);
  EXPECT_EQ(read_file(options.out_dir + "/tokenizer.json"), read_file((dir / "tokenizer.json").string()));
  EXPECT_EQ(load_tokenizer(options.out_dir)->encode("In the beginning"), load_tokenizer(dir.string())->encode("In the beginning"));
  EXPECT_NE(log.str().find("hf_bpe tokenizer (vocab 1200)"), std::string::npos) << log.str();
}

// What would encode differently is refused naming the file and the key.
TEST(HfTokenizerPrepare, WhatWouldEncodeDifferentlyIsRefusedNamingIt) {
  const fs::path dir = fs::path(TESSERA_HF_TOKENIZERS) / "llama3";
  if (!fs::exists(dir / "tokenizer.json")) GTEST_SKIP() << dir << " has no tokenizer (transformers missing?)";
  if (needs_patterns_without_them(dir)) GTEST_SKIP() << kWithoutPatterns;
  const auto original = nlohmann::json::parse(read_file((dir / "tokenizer.json").string()));
  const std::string out = fresh_dir("hf_refused");
  auto refused = [&](const std::function<void(nlohmann::json&)>& edit, std::initializer_list<std::string> parts) {
    nlohmann::json changed = original;
    edit(changed);
    write_file_durable(out + "/tokenizer.json", changed.dump());
    EXPECT_TRUE(throws_naming([&] { load_tokenizer(out); }, parts));
  };
  refused([](nlohmann::json& j) { j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed"; },
          {out + "/tokenizer.json", "Split with behavior 'Removed'"});
  refused([](nlohmann::json& j) { j["normalizer"] = {{"type", "NFKC"}}; }, {"normalizer 'NFKC'"});
  refused([](nlohmann::json& j) { j["pre_tokenizer"] = {{"type", "Metaspace"}}; },
          {"converted from SentencePiece", "tokenizer.model is missing"});
  refused([](nlohmann::json& j) { j["added_tokens"][0]["lstrip"] = true; }, {"<|begin_of_text|>", "lstrip"});
  refused([](nlohmann::json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed"; },
          {"does not compile"});
}

}  // namespace
}  // namespace tessera::test
