// Tokenizers: text <-> token ids. A data directory's (or a Hugging Face model folder's)
// tokenizer.json says which one made its token files:
//
//   {"type": "byte"}                                     every byte is a token, vocab 256
//   {"type": "gpt2", "vocab_size": 50257, "encoder": "encoder.json", "merges": "vocab.bpe"}
//                                                        GPT-2 byte-level BPE (gpt2_bpe.h); the two
//                                                        files lie beside tokenizer.json
//   {"type": "sentencepiece", "model": "tokenizer.model"}  SentencePiece BPE (sentencepiece.h)
//   Hugging Face's own tokenizer.json (it has a "model" object): its byte-level BPE (hf_tokenizer.h),
//                                                        or, converted from SentencePiece, the
//                                                        tokenizer.model beside it
// A folder with tokenizer.model and no tokenizer.json is SentencePiece.
//
// Invariant: for byte, gpt2 and a byte-level BPE without a normalizer, decode(encode(s)) == s for
// every byte string s (invalid UTF-8 included); decode passes bytes through and never validates
// UTF-8. A normalizing tokenizer (NFC, SentencePiece's remove_extra_whitespaces) round-trips the
// text it leaves unchanged.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tessera {

class Tokenizer {
 public:
  virtual ~Tokenizer();
  virtual std::vector<int64_t> encode(const std::string& text) const = 0;
  virtual std::string decode(const std::vector<int64_t>& tokens) const = 0;  // throws on ids >= vocab_size
  virtual int64_t vocab_size() const = 0;
  virtual std::string type() const = 0;  // "byte", "gpt2", "hf_bpe" or "sentencepiece"
};

std::unique_ptr<Tokenizer> make_byte_tokenizer();

// The files a directory's tokenizer consists of (those present): what a checkpoint copies from its
// data directory, so that `tessera generate` loads the tokenizer that made the data.
inline constexpr std::array<const char*, 4> kTokenizerFiles = {"tokenizer.json", "encoder.json", "vocab.bpe",
                                                               "tokenizer.model"};

// Reads dir/tokenizer.json (or dir/tokenizer.model); errors name the file and the key.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& dir);

}  // namespace tessera
