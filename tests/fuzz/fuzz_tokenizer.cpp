// libFuzzer target: a data directory's tokenizer as `prepare`, training and `generate` load it
// (data/tokenizer.h, load_tokenizer): tokenizer.json and, for GPT-2 byte-level BPE, the
// encoder.json and vocab.bpe it names (data/gpt2_bpe.h). The input is the three files' texts
// separated by lines "%%" (missing ones stay absent). Every input must load or end in
// tessera::Error; a tokenizer that loads must encode a fixed text (every byte value, UTF-8 and
// GPT-2's pre-tokeniser's cases) to ids below its vocabulary and decode them back to that text.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

#include "core/error.h"
#include "data/tokenizer.h"

namespace {

void write(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

std::string sample_text() {
  std::string text = "Hello, world! It's 2026: caf\xc3\xa9 \xe2\x82\xac 42  \n\t x's've";
  for (int b = 0; b < 256; ++b) text.push_back(static_cast<char>(b));
  return text;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  static const std::string dir = "/tmp/tessera-fuzz-tokenizer-" + std::to_string(getpid());
  static const bool made = [] { return system(("mkdir -p " + dir).c_str()) == 0; }();
  if (!made) __builtin_trap();
  const char* names[] = {"tokenizer.json", "encoder.json", "vocab.bpe"};
  size_t start = 0;
  for (const char* name : names) {
    const std::string path = dir + "/" + name;
    if (start > input.size()) {
      std::remove(path.c_str());
      continue;
    }
    const size_t end = input.find("\n%%\n", start);
    write(path, input.substr(start, end == std::string::npos ? std::string::npos : end - start));
    start = end == std::string::npos ? input.size() + 1 : end + 4;
  }
  static const std::string text = sample_text();
  try {
    const std::unique_ptr<tessera::Tokenizer> t = tessera::load_tokenizer(dir);
    const std::vector<int64_t> ids = t->encode(text);
    for (int64_t id : ids)
      if (id < 0 || id >= t->vocab_size()) __builtin_trap();
    if (t->decode(ids) != text) __builtin_trap();
  } catch (const tessera::Error&) {
  }
  return 0;
}
