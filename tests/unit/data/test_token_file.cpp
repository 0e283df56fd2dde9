// Token files: the llm.c and raw uint16 formats read back exactly, every malformed file is an
// error naming the file, and DataOptions::check names the bad key.
#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <cstring>
#include <filesystem>

#include "data/data_options.h"
#include "data/token_file.h"
#include "test_util.h"

namespace tessera {
namespace {

std::vector<int64_t> sample_tokens(int64_t n) {
  std::vector<int64_t> tokens(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) tokens[static_cast<size_t>(i)] = (i * 7919) % 50257;
  return tokens;
}

std::string int32s(std::vector<int32_t> values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(int32_t));
}

TEST(TokenFile, ReadsWhatWriteTokenFileWrote) {
  std::string path = test::fresh_dir("llmc") + "/t.bin";
  auto tokens = sample_tokens(1000);
  write_token_file(path, tokens);
  std::string bytes = read_file(path);
  ASSERT_EQ(bytes.size(), 1024u + 2000u);
  int32_t header[3];
  std::memcpy(header, bytes.data(), sizeof(header));
  EXPECT_EQ(header[0], 20240520);
  EXPECT_EQ(header[1], 1);
  EXPECT_EQ(header[2], 1000);

  TokenFile file = TokenFile::open(path);
  EXPECT_EQ(file.size(), 1000);
  EXPECT_EQ(file.path(), path);
  EXPECT_TRUE(torch::equal(file.window(0, 1000), torch::tensor(tokens)));
  EXPECT_TRUE(torch::equal(file.window(10, 5), torch::tensor(std::vector<int64_t>(tokens.begin() + 10, tokens.begin() + 15))));
  EXPECT_EQ(file.window(3, 4).scalar_type(), torch::kLong);
  EXPECT_EQ(file.vocab_bound(), *std::max_element(tokens.begin(), tokens.end()) + 1);
  EXPECT_TRUE(test::throws_naming([&] { file.window(998, 3); }, {path, "outside"}));
  EXPECT_TRUE(test::exists(path) && !test::exists(path + ".tmp"));
}

TEST(TokenFile, ReadsRawUint16WithoutHeader) {
  std::string path = test::fresh_dir("raw") + "/t.bin";
  std::vector<uint16_t> raw = {5, 0, 65535, 7, 300};
  write_file_durable(path, std::string(reinterpret_cast<const char*>(raw.data()), raw.size() * 2));
  TokenFile file = TokenFile::open(path);
  EXPECT_EQ(file.size(), 5);
  EXPECT_TRUE(torch::equal(file.window(0, 5), torch::tensor(std::vector<int64_t>{5, 0, 65535, 7, 300})));
  EXPECT_EQ(file.vocab_bound(), 65536);
}

TEST(TokenFile, CopiesShareTheMapping) {
  std::string path = test::fresh_dir("copy") + "/t.bin";
  write_token_file(path, {1, 2, 3});
  at::Tensor window;
  {
    TokenFile a = TokenFile::open(path);
    TokenFile b = a;
    a = TokenFile::open(path);
    window = b.window(0, 3);
    EXPECT_EQ(b[2], 3);
  }
  EXPECT_TRUE(torch::equal(window, torch::tensor(std::vector<int64_t>{1, 2, 3})));
}

TEST(TokenFile, MissingFileIsNamed) {
  std::string path = test::fresh_dir("missing") + "/nope.bin";
  EXPECT_TRUE(test::throws_naming([&] { TokenFile::open(path); }, {path, "cannot open"}));
}

TEST(TokenFile, EmptyFileIsNamed) {
  std::string path = test::fresh_dir("empty") + "/t.bin";
  write_file_durable(path, "");
  EXPECT_TRUE(test::throws_naming([&] { TokenFile::open(path); }, {path, "empty"}));
  write_token_file(path, {});
  EXPECT_TRUE(test::throws_naming([&] { TokenFile::open(path); }, {path, "no tokens"}));
}

TEST(TokenFile, OddSizeIsNamed) {
  std::string path = test::fresh_dir("odd") + "/t.bin";
  write_file_durable(path, "abc");
  EXPECT_TRUE(test::throws_naming([&] { TokenFile::open(path); }, {path, "not a multiple of 2"}));
}

TEST(TokenFile, TruncatedLlmcFileIsNamed) {
  std::string dir = test::fresh_dir("truncated");
  std::string path = dir + "/t.bin";
  write_token_file(path, sample_tokens(100));
  std::string bytes = read_file(path);
  write_file_durable(path, bytes.substr(0, bytes.size() - 20));  // 10 tokens cut off
  EXPECT_TRUE(test::throws_naming([&] { TokenFile::open(path); }, {path, "header says 100 tokens", "90 tokens"}));
  write_file_durable(path, bytes.substr(0, 512));  // cut inside the header
  EXPECT_TRUE(test::throws_naming([&] { TokenFile::open(path); }, {path, "header truncated"}));
  std::vector<int32_t> header(256, 0);
  header[0] = 20240520;
  header[1] = 2;
  header[2] = 1;
  write_file_durable(path, int32s(header) + std::string(4, '\0'));
  EXPECT_TRUE(test::throws_naming([&] { TokenFile::open(path); }, {path, "version 2"}));
}

// Tokens past 16 bits (Llama 3's 128256, Qwen's 151936 vocabularies) are written as llm.c's
// Llama 3 files (magic 20240801, version 7, uint32) and read back; a file of small tokens stays
// uint16; what fits neither is refused.
TEST(TokenFile, WideTokensAreWrittenAsUint32AndReadBack) {
  const std::string dir = test::fresh_dir("wide");
  write_token_file(dir + "/wide.bin", {1, 70000, 151935});
  const TokenFile wide = TokenFile::open(dir + "/wide.bin");
  EXPECT_EQ(wide.size(), 3);
  EXPECT_EQ(wide[1], 70000u);
  EXPECT_EQ(wide.vocab_bound(), 151936);
  EXPECT_TRUE(torch::equal(wide.window(0, 3), torch::tensor({1, 70000, 151935}, torch::kLong)));
  EXPECT_EQ(std::filesystem::file_size(dir + "/wide.bin"), 256 * 4 + 3 * 4u);
  write_token_file(dir + "/narrow.bin", {1, 65535});
  EXPECT_EQ(std::filesystem::file_size(dir + "/narrow.bin"), 256 * 4 + 2 * 2u);
  EXPECT_EQ(TokenFile::open(dir + "/narrow.bin")[1], 65535u);
  EXPECT_TRUE(test::throws_naming([&] { write_token_file(dir + "/bad.bin", {1, -3}); }, {"bad.bin", "-3", "uint32"}));
}

TEST(DataOptions, CheckNamesTheKey) {
  DataOptions ok;
  EXPECT_NO_THROW(ok.check("c.toml"));
  DataOptions bad = ok;
  bad.path = "";
  EXPECT_TRUE(test::throws_naming([&] { bad.check("c.toml"); }, {"c.toml", "data.path"}));
  bad = ok;
  bad.val_file = bad.train_file;
  EXPECT_TRUE(test::throws_naming([&] { bad.check("c.toml"); }, {"c.toml", "data.train_file", "data.val_file"}));
  bad = ok;
  bad.seed = -1;
  EXPECT_TRUE(test::throws_naming([&] { bad.check("c.toml"); }, {"c.toml", "data.seed", "-1"}));
}

}  // namespace
}  // namespace tessera
