// Tokenizers: the byte tokenizer round-trips any bytes; GPT-2 BPE gives the ids of OpenAI's
// encoder.py algorithm (golden_data.py, synthetic vocabulary), applies merges in rank order,
// classifies every assigned code point as Unicode does and round-trips any bytes; bad vocabularies are
// refused naming their file.
#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <limits>

#include <nlohmann/json.hpp>

#include "data/byte_level_bpe.h"
#include "data/gpt2_bpe.h"
#include "data/tokenizer.h"
#include "test_util.h"

namespace tessera {
namespace {

std::string all_bytes_and_invalid_utf8() {
  std::string s;
  for (int b = 0; b < 256; ++b) s += static_cast<char>(b);
  return s + "\xC3\x28 \xE2\x82 \xF0\x9F\x98 \xC0\xAF \xED\xA0\x80 \xFF\xFE";  // bad continuations, overlong, surrogate
}

std::vector<int64_t> ids(const at::Tensor& t) { return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel()); }

Gpt2Bpe golden_bpe() { return Gpt2Bpe(test::golden_path("bpe/encoder.json"), test::golden_path("bpe/vocab.bpe")); }

TEST(ByteTokenizer, RoundTripsAnyBytes) {
  auto tokenizer = make_byte_tokenizer();
  EXPECT_EQ(tokenizer->vocab_size(), 256);
  EXPECT_EQ(tokenizer->type(), "byte");
  std::string text = all_bytes_and_invalid_utf8();
  std::vector<int64_t> tokens = tokenizer->encode(text);
  ASSERT_EQ(tokens.size(), text.size());
  EXPECT_EQ(tokens[200], 200);
  EXPECT_EQ(tokenizer->decode(tokens), text);
  EXPECT_TRUE(test::throws_naming([&] { tokenizer->decode({256}); }, {"256"}));
}

TEST(LoadTokenizer, ReadsTokenizerJsonAndNamesBadKeys) {
  std::string dir = test::fresh_dir("tokjson");
  write_file_durable(dir + "/tokenizer.json", R"({"type": "byte"})");
  EXPECT_EQ(load_tokenizer(dir)->type(), "byte");
  write_file_durable(dir + "/tokenizer.json", R"({"kind": "byte"})");
  EXPECT_TRUE(test::throws_naming([&] { load_tokenizer(dir); }, {dir + "/tokenizer.json", "'type'"}));
  write_file_durable(dir + "/tokenizer.json", R"({"type": "sentencepiece"})");
  EXPECT_TRUE(test::throws_naming([&] { load_tokenizer(dir); }, {dir + "/tokenizer.json", "'model'"}));
  write_file_durable(dir + "/tokenizer.json", R"({"type": "wordpiece"})");
  EXPECT_TRUE(test::throws_naming([&] { load_tokenizer(dir); }, {dir + "/tokenizer.json", "\"wordpiece\"", "sentencepiece"}));
  write_file_durable(dir + "/tokenizer.json", R"({"type": "gpt2", "encoder": "encoder.json", "merges": "vocab.bpe"})");
  EXPECT_TRUE(test::throws_naming([&] { load_tokenizer(dir); }, {dir + "/tokenizer.json", "'vocab_size'"}));
  write_file_durable(dir + "/tokenizer.json", "{not json");
  EXPECT_TRUE(test::throws_naming([&] { load_tokenizer(dir); }, {dir + "/tokenizer.json", "JSON"}));
  EXPECT_TRUE(test::throws_naming([&] { load_tokenizer(dir + "/absent"); }, {dir + "/absent/tokenizer.json"}));
}

TEST(Gpt2Bpe, MatchesEncoderPyOnGoldenCases) {
  auto golden = test::golden("bpe_cases.safetensors");
  Gpt2Bpe bpe = golden_bpe();
  EXPECT_EQ(bpe.vocab_size(), std::stoll(golden.metadata.at("vocab_size")));
  EXPECT_EQ(bpe.merges(), bpe.vocab_size() - 257);
  const int cases = std::stoi(golden.metadata.at("cases"));
  ASSERT_GE(cases, 10);
  for (int i = 0; i < cases; ++i) {
    const std::string text = golden.metadata.at("text_" + std::to_string(i));
    auto pieces = nlohmann::json::parse(golden.metadata.at("pieces_" + std::to_string(i))).get<std::vector<std::string>>();
    EXPECT_EQ(gpt2_pretokenize(text), pieces) << "case " << i << ": " << text;
    std::vector<int64_t> expected = ids(golden.tensors.at("ids_" + std::to_string(i)));
    std::vector<int64_t> actual = bpe.encode(text);
    EXPECT_EQ(actual, expected) << "case " << i << ": " << text;
    EXPECT_LT(actual.size(), text.size()) << "merges should shorten case " << i;
    EXPECT_EQ(bpe.decode(actual), text);
    EXPECT_EQ(bpe.encode(text), actual) << "the per-piece cache must not change results";
  }
}

TEST(Gpt2Bpe, PretokenizesWhitespaceAndContractionsLikeTheRegex) {
  using V = std::vector<std::string>;
  EXPECT_EQ(gpt2_pretokenize("a  b"), (V{"a", " ", " b"}));
  EXPECT_EQ(gpt2_pretokenize("x\n\ny"), (V{"x", "\n", "\n", "y"}));
  EXPECT_EQ(gpt2_pretokenize("end   "), (V{"end", "   "}));
  EXPECT_EQ(gpt2_pretokenize("it's 'sup"), (V{"it", "'s", " '", "sup"}));
  EXPECT_EQ(gpt2_pretokenize("I'LL x12y"), (V{"I", "'", "LL", " x", "12", "y"}));
  EXPECT_EQ(gpt2_pretokenize("caf\u00e9!?"), (V{"caf\u00e9", "!?"}));
  EXPECT_EQ(gpt2_pretokenize(""), V{});
}

TEST(Gpt2Bpe, CharClassesMatchUnicodeForEveryAssignedCodePoint) {
  auto golden = test::golden("gpt2_char_classes.safetensors");
  const at::Tensor& classes = golden.tensors.at("classes");
  ASSERT_EQ(classes.numel(), 0x110000);
  const uint8_t* expected = classes.data_ptr<uint8_t>();
  int64_t checked = 0, wrong = 0;
  for (uint32_t cp = 0; cp < 0x110000; ++cp) {
    if (expected[cp] == 255) continue;  // unassigned in Unicode
    ++checked;
    if (static_cast<uint8_t>(gpt2_char_class(cp)) != expected[cp] && wrong++ < 5)
      ADD_FAILURE() << "U+" << std::hex << cp << ": class " << int(gpt2_char_class(cp)) << " expected "
                    << int(expected[cp]);
  }
  EXPECT_EQ(wrong, 0);
  EXPECT_GT(checked, 200000);
}

// A vocabulary of the 256 bytes plus "ab", "bc", "abc", with merges in the given order.
Gpt2Bpe tiny_bpe(const std::string& dir, const std::string& merges) {
  nlohmann::json encoder;
  auto golden = nlohmann::json::parse(read_file(test::golden_path("bpe/encoder.json")));
  for (const auto& [symbol, id] : golden.items())
    if (id.get<int64_t>() < 256) encoder[symbol] = id;
  encoder["ab"] = 256;
  encoder["bc"] = 257;
  encoder["abc"] = 258;
  write_file_durable(dir + "/encoder.json", encoder.dump());
  write_file_durable(dir + "/vocab.bpe", "#version: 0.2\n" + merges);
  return Gpt2Bpe(dir + "/encoder.json", dir + "/vocab.bpe");
}

TEST(Gpt2Bpe, MergesApplyInRankOrder) {
  std::string dir = test::fresh_dir("ranks");
  const int64_t a = 'a' - 33, b = 'b' - 33, c = 'c' - 33;  // ids of printable ASCII in encoder.py order
  EXPECT_EQ(tiny_bpe(dir, "a b\nb c\n").encode("abc"), (std::vector<int64_t>{256, c}));
  EXPECT_EQ(tiny_bpe(dir, "b c\na b\n").encode("abc"), (std::vector<int64_t>{a, 257}));
  EXPECT_EQ(tiny_bpe(dir, "a b\nb c\nab c\n").encode("abc"), (std::vector<int64_t>{258}));
  EXPECT_EQ(tiny_bpe(dir, "a b\n").encode("ababb"), (std::vector<int64_t>{256, 256, b}));
  EXPECT_EQ(tiny_bpe(dir, "").encode("abc"), (std::vector<int64_t>{a, b, c}));
}

TEST(Gpt2Bpe, RoundTripsArbitraryBytes) {
  Gpt2Bpe bpe = golden_bpe();
  std::string text = all_bytes_and_invalid_utf8() + " caf\u00e9 \u65e5\u672c \U0001F600 don't  \t\n 123";
  EXPECT_EQ(bpe.decode(bpe.encode(text)), text);
  EXPECT_TRUE(test::throws_naming([&] { bpe.decode({bpe.vocab_size()}); }, {"encoder.json", "not in the vocabulary"}));
}

TEST(Gpt2Bpe, BadVocabularyFilesAreNamed) {
  std::string dir = test::fresh_dir("badbpe");
  write_file_durable(dir + "/encoder.json", R"({"a": 0})");
  write_file_durable(dir + "/vocab.bpe", "#version: 0.2\n");
  EXPECT_TRUE(test::throws_naming([&] { Gpt2Bpe(dir + "/encoder.json", dir + "/vocab.bpe"); },
                                  {dir + "/encoder.json", "no token for byte"}));
  EXPECT_TRUE(test::throws_naming([&] { tiny_bpe(dir, "a b\nabc\n"); }, {dir + "/vocab.bpe:3", "abc"}));
  // Two tokens sharing an id: prepare accepted this, and decoding could not tell them apart.
  write_file_durable(dir + "/vocab.bpe", "#version: 0.2\n");
  write_file_durable(dir + "/encoder.json", R"({"a": 0, "b": 0})");
  EXPECT_TRUE(test::throws_naming([&] { Gpt2Bpe(dir + "/encoder.json", dir + "/vocab.bpe"); },
                                  {dir + "/encoder.json", "tokens 'a' and 'b' share id 0"}));
  EXPECT_TRUE(test::throws_naming([&] { tiny_bpe(dir, "a \xE2\x82\xAC\n"); }, {dir + "/vocab.bpe:2", "alphabet"}));
  // An id of 10^12: refused naming the file before a decoder table of that size is allocated (this
  // ended in std::bad_alloc in prepare and in training).
  write_file_durable(dir + "/vocab.bpe", "#version: 0.2\n");
  write_file_durable(dir + "/encoder.json", R"({"a": 0, "b": 1000000000000})");
  EXPECT_TRUE(test::throws_naming([&] { Gpt2Bpe(dir + "/encoder.json", dir + "/vocab.bpe"); },
                                  {dir + "/encoder.json", "id 1000000000000 is not below the number of tokens 2"}));
  // A whole encoder but a vocab_size of 10^12 from tokenizer.json: refused before its decoder table
  // (seen in the loader while writing the tokenizer fuzz target: it allocated that table).
  tiny_bpe(dir, "");
  EXPECT_TRUE(test::throws_naming([&] { Gpt2Bpe(dir + "/encoder.json", dir + "/vocab.bpe", 1000000000000); },
                                  {dir + "/encoder.json", "vocab_size 1000000000000 exceeds its 259 tokens"}));
  EXPECT_EQ(Gpt2Bpe(dir + "/encoder.json", dir + "/vocab.bpe", 259 + Gpt2Bpe::kMaxVocabPadding).vocab_size(),
            259 + Gpt2Bpe::kMaxVocabPadding);
}

// A Hugging Face byte-level vocabulary (ids need not be dense) without a vocab_size, one of whose ids
// is 2^63 - 1: refused by name before the size, largest id + 1, overflows (found by fuzz_replay's
// tokenizer target under UBSan; the seed tests/fuzz/corpus/tokenizer/id_at_int64_max).
TEST(ByteLevelBpeSpec, AnIdFarPastTheTokensIsRefusedBeforeTheSizeOverflows) {
  ByteLevelBpe::Spec spec;
  spec.source = "tokenizer.json";
  for (int b = 0; b < 256; ++b) spec.vocabulary.emplace_back(std::string(1, static_cast<char>(b)), b);
  spec.vocabulary.emplace_back("ab", std::numeric_limits<int64_t>::max());
  EXPECT_TRUE(test::throws_naming([&] { ByteLevelBpe{spec}; },
                                  {"tokenizer.json", "id 9223372036854775807 exceeds its 257 tokens by more than 65536"}));
  spec.vocabulary.back().second = 256 + ByteLevelBpe::kMaxVocabPadding;
  EXPECT_EQ(ByteLevelBpe(spec).vocab_size(), 257 + ByteLevelBpe::kMaxVocabPadding);
}

}  // namespace
}  // namespace tessera
