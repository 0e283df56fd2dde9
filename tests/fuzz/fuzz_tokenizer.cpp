// libFuzzer target: a data directory's tokenizer as `prepare`, training and `generate` load it
// (data/tokenizer.h, load_tokenizer): tokenizer.json (tessera's, or Hugging Face's byte-level BPE
// with its regexes, normalizer and added tokens: data/hf_tokenizer.h) and, for GPT-2 byte-level
// BPE, the encoder.json and vocab.bpe it names (data/gpt2_bpe.h), and a SentencePiece
// tokenizer.model (data/sentencepiece.h). The input is the four files' texts separated by lines
// "%%" (missing ones stay absent). Every input must load or end in
// tessera::Error; a tokenizer that loads must encode a fixed text (every byte value, UTF-8 and
// GPT-2's pre-tokeniser's cases) to ids below its vocabulary and decode them back to that text
// (SentencePiece: decode them).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/error.h"
#include "data/tokenizer.h"
#include "fuzz_files.h"

namespace {

std::string sample_text() {
  std::string text = "Hello, world! It's 2026: caf\xc3\xa9 \xe2\x82\xac 42  \n\t x's've";
  for (int b = 0; b < 256; ++b) text.push_back(static_cast<char>(b));
  return text;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const std::string& dir = tessera::fuzz::scratch_dir("tokenizer");
  tessera::fuzz::write_parts(dir, input, {"tokenizer.json", "encoder.json", "vocab.bpe", "tokenizer.model"});
  static const std::string text = sample_text();
  try {
    const std::unique_ptr<tessera::Tokenizer> t = tessera::load_tokenizer(dir);
    const std::vector<int64_t> ids = t->encode(text);
    for (int64_t id : ids)
      if (id < 0 || id >= t->vocab_size()) __builtin_trap();
    // SentencePiece normalizes (remove_extra_whitespaces) and may write unknown pieces: its decode
    // need not give the text back, but must decode what it encoded.
    if (t->type() == "sentencepiece") t->decode(ids);
    else if (t->decode(ids) != text) __builtin_trap();
  } catch (const tessera::Error&) {
  }
  return 0;
}
