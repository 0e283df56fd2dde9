#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>

#include "core/error.h"
#include "core/fs.h"
#include "test_util.h"

namespace tessera {
namespace {

std::string tmp(const std::string& name) { return testing::TempDir() + "/" + name; }

TEST(Safetensors, ReadsWhatPythonWrote) {
  auto c = test::golden("safetensors_roundtrip.safetensors");
  EXPECT_EQ(c.metadata.at("note"), "from python");
  EXPECT_TRUE(torch::equal(c.tensors.at("f32"), torch::arange(6, torch::kFloat32).reshape({2, 3}) / 7));
  EXPECT_EQ(c.tensors.at("bf16").scalar_type(), torch::kBFloat16);
  EXPECT_EQ(c.tensors.at("i64")[1][1].item<int64_t>(), int64_t(1) << 40);
  EXPECT_EQ(c.tensors.at("u8")[1].item<int>(), 255);
  EXPECT_EQ(c.tensors.at("empty").sizes(), torch::IntArrayRef({0, 4}));
}

TEST(Safetensors, RoundTripsEveryDtype) {
  NamedTensors in = {{"a", torch::randn({3, 4})},
                     {"b", torch::randn({5}).to(torch::kBFloat16)},
                     {"c", torch::randn({2, 2}).to(torch::kHalf)},
                     {"d", torch::arange(10)},
                     {"e", torch::randn({4, 3}).t()}};  // non-contiguous input
  std::string path = tmp("rt.safetensors");
  write_safetensors(path, in, {{"k", "v"}});
  auto out = read_safetensors(path);
  EXPECT_EQ(out.metadata.at("k"), "v");
  for (const auto& [name, t] : in) EXPECT_TRUE(torch::equal(out.tensors.at(name), t)) << name;
  // The header is padded so tensor data starts 8-byte aligned.
  std::string bytes = read_file(path);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(uint8_t(bytes[i])) << (8 * i);
  EXPECT_EQ(n % 8, 0u);
}

TEST(Safetensors, TruncatedFileIsAnErrorNamingTheFile) {
  std::string path = tmp("trunc.safetensors");
  write_safetensors(path, {{"w", torch::randn({64, 64})}});
  std::string bytes = read_file(path);
  write_file_durable(path, bytes.substr(0, bytes.size() - 100));
  try {
    read_safetensors(path);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
  write_file_durable(path, bytes.substr(0, 5));
  EXPECT_THROW(read_safetensors(path), Error);
}

TEST(Safetensors, CorruptHeaderIsAnError) {
  std::string path = tmp("bad.safetensors");
  write_safetensors(path, {{"w", torch::randn({4})}});
  std::string bytes = read_file(path);
  bytes[8] = '#';  // the header's opening brace
  write_file_durable(path, bytes);
  EXPECT_THROW(read_safetensors(path), Error);
}

// A header whose shape multiplies past int64 (or past the file) is refused naming the tensor,
// before anything is allocated (this ended in bad_alloc or "negative dimension").
TEST(Safetensors, HugeOrOverflowingShapesAreRefusedBeforeAllocating) {
  for (const std::string shape : {"[4294967296, 4294967296]", "[1099511627776]"}) {
    const std::string header = R"({"w": {"dtype": "F32", "shape": )" + shape + R"(, "data_offsets": [0, 16]}})";
    std::string bytes(8, '\0');
    for (int i = 0; i < 8; ++i) bytes[static_cast<size_t>(i)] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
    bytes += header + std::string(16, '\0');
    const std::string path = tmp("huge.safetensors");
    write_file_durable(path, bytes);
    EXPECT_TRUE(test::throws_naming([&] { read_safetensors(path); }, {path, "tensor 'w'", "more bytes than the file holds"}))
        << shape;
    EXPECT_TRUE(test::throws_naming([&] { read_safetensors_tensor(path, "w"); }, {path, "more bytes than the file holds"}))
        << shape;
  }
}

TEST(Checksum, ChangesWithOneByte) {
  std::string path = tmp("sum.bin");
  write_file_durable(path, "hello world");
  std::string a = file_checksum(path);
  write_file_durable(path, "hello worle");
  EXPECT_NE(a, file_checksum(path));
  EXPECT_EQ(a.size(), 16u);
}

}  // namespace
}  // namespace tessera
