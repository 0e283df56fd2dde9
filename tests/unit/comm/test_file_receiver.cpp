// The receiving side of a file transfer (comm/file_receiver.h) over messages given here: what a
// well-formed transfer writes, and the senders' names and headers it refuses, naming the sender.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <vector>

#include <ATen/ATen.h>

#include "comm/file_receiver.h"
#include "core/error.h"
#include "test_util.h"

namespace tessera::comm {
namespace {

// The sender's messages back to back: each message takes as many bytes as the receiver asks for.
struct Stream {
  std::vector<char> bytes;
  size_t at = 0;
  void add_long(int64_t v) { bytes.insert(bytes.end(), reinterpret_cast<char*>(&v), reinterpret_cast<char*>(&v) + 8); }
  void add_text(const std::string& s) { bytes.insert(bytes.end(), s.begin(), s.end()); }
  void add_file(const std::string& name, const std::string& body) {
    add_long(static_cast<int64_t>(name.size()));
    add_long(static_cast<int64_t>(body.size()));
    add_text(name);
    add_text(body);
  }
  MessageSource source() {
    return [this](at::Tensor& into, int64_t) {
      const size_t n = static_cast<size_t>(into.nbytes());
      if (bytes.size() - at < n) fail("closed");
      std::memcpy(into.data_ptr(), bytes.data() + at, n);
      at += n;
    };
  }
};

std::string refusal(Stream stream, const std::string& dir) {
  try {
    receive_files_from(stream.source(), dir, "rank 3");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(FileReceiver, WritesTheSendersFilesAndRefusesWhatIsNotAPlainFileName) {
  const std::string dir = test::fresh_dir("file_receiver");
  Stream good;
  good.add_long(2);
  good.add_file("meta.json", "{\"step\": 4}");
  good.add_file("empty", "");
  EXPECT_EQ(receive_files_from(good.source(), dir + "/in", "rank 3"), (std::vector<std::string>{"meta.json", "empty"}));
  EXPECT_EQ(std::filesystem::file_size(dir + "/in/meta.json"), 11u);
  EXPECT_EQ(std::filesystem::file_size(dir + "/in/empty"), 0u);

  for (const std::string& name : {std::string("../up"), std::string(".."), std::string("."), std::string("a\0b", 3)}) {
    Stream bad;
    bad.add_long(1);
    bad.add_file(name, "x");
    EXPECT_NE(refusal(bad, dir + "/bad").find("rank 3 sent a file named"), std::string::npos) << name;
  }
  EXPECT_FALSE(std::filesystem::exists(dir + "/bad/a"));  // the name before a NUL is not written either
  Stream negative;
  negative.add_long(-1);
  EXPECT_NE(refusal(negative, dir + "/bad").find("rank 3 announced -1 files"), std::string::npos);
  Stream header;
  header.add_long(1);
  header.add_long(0);
  header.add_long(5);
  EXPECT_NE(refusal(header, dir + "/bad").find("a file from rank 3 has a malformed header"), std::string::npos);
}

}  // namespace
}  // namespace tessera::comm
