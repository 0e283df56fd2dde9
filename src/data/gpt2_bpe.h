// GPT-2 byte-level BPE, as OpenAI's encoder.py:
//   1. pre-tokenise the text with GPT-2's pattern
//        's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//      (matched by hand on UTF-8 code points, gpt2_pretokenize);
//   2. split each piece into bytes and merge adjacent symbols, lowest merge rank first, until no
//      pair of the piece has a rank (results cached per piece);
//   3. look each symbol up in encoder.json.
// encoder.json and vocab.bpe hold symbols through encoder.py's byte -> printable-character map;
// here symbols are kept as raw bytes, so decode is the concatenation of the tokens' bytes.
//
// Character classes: \p{L}, \p{N} and \s are exact for every assigned code point of Unicode 14
// (gpt2_unicode_table.inc, generated from Python's unicodedata); unassigned code points take the
// class of their neighbours. Bytes that are not valid UTF-8 are classed as punctuation, one per
// byte, so any byte string encodes and round-trips.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "data/tokenizer.h"

namespace tessera {

enum class Gpt2CharClass : uint8_t { Letter = 0, Number = 1, Space = 2, Other = 3 };

Gpt2CharClass gpt2_char_class(uint32_t code_point);

// The pieces of step 1, as byte strings whose concatenation is `text`.
std::vector<std::string> gpt2_pretokenize(const std::string& text);

class Gpt2Bpe : public Tokenizer {
 public:
  // vocab_size 0 takes one more than the largest id of encoder.json; otherwise every id must be
  // below it, and it may exceed the encoder's token count by kMaxVocabPadding at most (padding).
  // Errors name the file and the entry.
  static constexpr int64_t kMaxVocabPadding = 65536;
  Gpt2Bpe(const std::string& encoder_json, const std::string& vocab_bpe, int64_t vocab_size = 0);

  std::vector<int64_t> encode(const std::string& text) const override;
  std::string decode(const std::vector<int64_t>& tokens) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  std::string type() const override { return "gpt2"; }

  int64_t merges() const { return static_cast<int64_t>(ranks_.size()); }

 private:
  const std::vector<int64_t>& encode_piece(const std::string& piece) const;

  std::string encoder_path_;
  int64_t vocab_size_ = 0;
  std::unordered_map<std::string, int64_t> encoder_;  // raw-byte symbol -> id
  std::vector<std::string> decoder_;                  // id -> raw bytes
  std::vector<bool> known_;                           // id -> present in encoder.json
  std::unordered_map<std::string, int64_t> ranks_;    // pair_key(a, b) -> merge rank
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int64_t>> cache_;  // piece -> ids
};

}  // namespace tessera
