// libFuzzer target: training data as a run opens it (data/token_stream.h, data/token_file.h): a
// glob pattern over up to three shard files in a fresh directory, each shard llm.c's format (a
// 256-int32 header, then uint16 tokens) or nanoGPT's raw tokens. The input is the pattern's line,
// then the shards' bytes separated by lines "%%". Patterns that leave the directory ("..", "/")
// are skipped: the target reads only files it wrote. Every input must open or end in
// tessera::Error; a stream that opens must read its first and last tokens and a window across
// every shard boundary, each token below its vocab_bound().
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/token_stream.h"
#include "fuzz_files.h"

namespace {

void check_window(const tessera::TokenStream& s, int64_t begin, int64_t length) {
  begin = std::max<int64_t>(0, std::min(begin, s.size() - 1));
  length = std::min(length, s.size() - begin);
  std::vector<int64_t> out(static_cast<size_t>(length));
  s.read(begin, length, out.data());
  for (int64_t t : out)
    if (t < 0 || t >= s.vocab_bound()) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t eol = input.find('\n');
  if (eol == std::string::npos) return 0;
  const std::string pattern = input.substr(0, eol);
  if (pattern.find("..") != std::string::npos || pattern.find('/') != std::string::npos) return 0;
  const std::string& dir = tessera::fuzz::scratch_dir("token_files");
  tessera::fuzz::write_parts(dir, input.substr(eol + 1), {"s0.bin", "s1.bin", "s2.bin"});
  try {
    const tessera::TokenStream s = tessera::TokenStream::open(dir, pattern);
    if (s.size() <= 0) __builtin_trap();
    check_window(s, 0, 16);
    check_window(s, s.size() - 1, 1);
    int64_t boundary = 0;
    for (size_t i = 0; i + 1 < s.shards().size(); ++i) {
      boundary += s.shards()[i].size();
      check_window(s, boundary - 2, 4);
    }
    const tessera::TokenStream::Position p = s.locate(s.size() - 1);
    if (p.shard < 0 || p.shard >= static_cast<int64_t>(s.shards().size()) || p.offset < 0) __builtin_trap();
  } catch (const tessera::Error&) {
  }
  return 0;
}
