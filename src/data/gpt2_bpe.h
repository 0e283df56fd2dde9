// GPT-2 byte-level BPE, as OpenAI's encoder.py: the byte-level BPE of byte_level_bpe.h with
// GPT-2's pre-tokenizer, the pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// matched by hand on UTF-8 code points (gpt2_pretokenize; Hugging Face's tokenizer.json of GPT-2,
// a ByteLevel pre-tokenizer with use_regex, uses it too: hf_tokenizer.h).
//
// Character classes: \p{L}, \p{N} and \s are exact for every assigned code point of Unicode 14
// (gpt2_unicode_table.inc, generated from Python's unicodedata); unassigned code points take the
// class of their neighbours. Bytes that are not valid UTF-8 are classed as punctuation, one per
// byte, so any byte string encodes and round-trips.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/byte_level_bpe.h"

namespace tessera {

enum class Gpt2CharClass : uint8_t { Letter = 0, Number = 1, Space = 2, Other = 3 };

Gpt2CharClass gpt2_char_class(uint32_t code_point);

// The pieces of step 1, as byte strings whose concatenation is `text`.
std::vector<std::string> gpt2_pretokenize(const std::string& text);

// GPT-2's encoder.json and vocab.bpe read into the byte-level BPE with GPT-2's pre-tokenizer.
// vocab_size 0 takes one more than the largest id of encoder.json (whose ids must be 0 .. n - 1);
// otherwise every id must be below it, and it may exceed the encoder's token count by
// kMaxVocabPadding at most (padding). Errors name the file and the entry.
class Gpt2Bpe : public ByteLevelBpe {
 public:
  Gpt2Bpe(const std::string& encoder_json, const std::string& vocab_bpe, int64_t vocab_size = 0);
};

}  // namespace tessera
