// A pre-tokenizer's regular expression (Hugging Face's Split with behavior "Isolated"): the text
// cut into the pattern's successive leftmost matches and the gaps between them, every piece kept,
// so the pieces concatenate to the text. Matched by PCRE2 with Unicode properties (\p{L}, \p{N},
// \s of every code point: PCRE2_UCP) over UTF-8; bytes that are not valid UTF-8 never match
// (PCRE2_MATCH_INVALID_UTF) and fall into the gaps, so any byte string splits and round-trips.
// Built only with PCRE2 (TESSERA_TOKENIZERS, CMakeLists.txt); without it construction throws.
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace tessera {

class RegexSplit {
 public:
  // Throws naming `where` and the pattern's error offset when it does not compile, and naming
  // `where` when a match fails (PCRE2's match limit: a pattern that backtracks without end).
  RegexSplit(const std::string& pattern, const std::string& where);
  ~RegexSplit();
  RegexSplit(RegexSplit&&) noexcept;
  std::vector<std::string> operator()(const std::string& text) const;

 private:
  struct Compiled;
  std::string where_;
  std::unique_ptr<Compiled> compiled_;
};

// Text in Unicode normalization form C (Qwen's normalizer); bytes that are not valid UTF-8 are
// kept as they are, between the normalized runs. Built with utf8proc (TESSERA_TOKENIZERS).
std::string nfc_normalize(const std::string& text);

}  // namespace tessera
