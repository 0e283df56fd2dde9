// Byte-level BPE, the one encoder behind GPT-2's files (gpt2_bpe.h) and Hugging Face's
// tokenizer.json of Llama 3, Qwen and GPT-2 (hf_tokenizer.h):
//   0. added tokens (special ones such as <|begin_of_text|>) are cut out of the text first, longest
//      first where two start at the same byte, and each is its own id;
//   1. the rest is normalized (optional: Qwen's NFC) and pre-tokenized into pieces;
//   2. a piece that is itself in the vocabulary is one token where `ignore_merges` (Llama 3);
//      otherwise it is split into bytes and adjacent symbols are merged, lowest merge rank first,
//      until no pair of the piece has a rank (results cached per piece);
//   3. each symbol is looked up in the vocabulary.
// Vocabulary and merge files hold symbols through GPT-2's byte -> printable-character map
// (bytes_to_unicode); here symbols are raw bytes (byte_level_bytes converts), so decode is the
// concatenation of the tokens' bytes and any byte string encodes (every byte is a symbol).
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "data/tokenizer.h"

namespace tessera {

// A symbol written in GPT-2's byte-to-unicode alphabet back to its raw bytes; throws naming `where`.
std::string byte_level_bytes(const std::string& symbol, const std::string& where);

class ByteLevelBpe : public Tokenizer {
 public:
  using Split = std::function<std::vector<std::string>(const std::string&)>;  // pieces concatenate to the text
  using Normalize = std::function<std::string(const std::string&)>;

  struct Spec {
    std::string source;  // the file errors name
    std::string type;    // what type() says
    std::vector<std::pair<std::string, int64_t>> vocabulary;              // raw-byte symbol -> id
    std::vector<std::pair<std::string, std::string>> merges;              // raw-byte pairs, rank order
    std::vector<std::pair<std::string, int64_t>> added;                   // text -> id, matched first
    int64_t vocab_size = 0;      // 0: the largest id + 1; larger: padding (kMaxVocabPadding at most)
    bool dense_ids = false;      // the vocabulary's ids must be 0 .. n - 1 when vocab_size is 0
    bool ignore_merges = false;  // a piece in the vocabulary is one token
    Split pretokenize;
    Normalize normalize;         // empty: none
  };
  static constexpr int64_t kMaxVocabPadding = 65536;

  // Checks the spec: ids non-negative, distinct (one text per id) and below vocab_size, all 256
  // bytes present. Errors name spec.source and the entry; a merge whose result has no id is named
  // when a piece needs it.
  explicit ByteLevelBpe(Spec spec);

  std::vector<int64_t> encode(const std::string& text) const override;
  std::string decode(const std::vector<int64_t>& tokens) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  std::string type() const override { return type_; }
  int64_t merges() const { return static_cast<int64_t>(ranks_.size()); }

 private:
  void encode_text(const std::string& text, std::vector<int64_t>& ids) const;  // steps 1-3
  const std::vector<int64_t>& encode_piece(const std::string& piece) const;

  std::string source_, type_;
  int64_t vocab_size_ = 0;
  bool ignore_merges_ = false;
  Split pretokenize_;
  Normalize normalize_;
  std::unordered_map<std::string, int64_t> encoder_;  // raw-byte symbol -> id
  std::vector<std::pair<std::string, int64_t>> added_;  // longest first
  std::vector<std::vector<size_t>> added_by_byte_;     // first byte -> indices into added_
  std::vector<std::string> decoder_;                  // id -> raw bytes
  std::vector<bool> known_;                           // id -> in the vocabulary or added
  std::unordered_map<std::string, int64_t> ranks_;    // pair key -> merge rank
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int64_t>> cache_;  // piece -> ids
};

}  // namespace tessera
