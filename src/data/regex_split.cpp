// RegexSplit with PCRE2 and NFC with utf8proc (regex_split.h); without them (TESSERA_TOKENIZERS
// off) both say what to install.
#include "data/regex_split.h"

#include "core/error.h"
#include "data/utf8.h"

#if TESSERA_TOKENIZERS
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>
#endif

namespace tessera {

#if TESSERA_TOKENIZERS

struct RegexSplit::Compiled {
  pcre2_code* code = nullptr;
  ~Compiled() { pcre2_code_free(code); }
};

RegexSplit::RegexSplit(const std::string& pattern, const std::string& where)
    : where_(where), compiled_(new Compiled) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  compiled_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                  PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error, &offset, nullptr);
  if (!compiled_->code) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    fail(where, ": the pattern '", pattern, "' does not compile at offset ", offset, " (",
         reinterpret_cast<const char*>(message), ")");
  }
  pcre2_jit_compile(compiled_->code, PCRE2_JIT_COMPLETE);  // the interpreter stays where JIT is absent
}

std::vector<std::string> RegexSplit::operator()(const std::string& text) const {
  std::vector<std::string> pieces;
  pcre2_match_data* match = pcre2_match_data_create_from_pattern(compiled_->code, nullptr);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t done = 0, from = 0;
  while (from < text.size()) {
    const int rc = pcre2_match(compiled_->code, subject, text.size(), from, 0, match, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;  // the rest is one gap
    if (rc < 0) {  // a match or depth limit (a pattern that backtracks without end), never a silent gap
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof(message));
      pcre2_match_data_free(match);
      fail(where_, ": the pre-tokenizer pattern failed at byte ", from, " (", reinterpret_cast<const char*>(message), ")");
    }
    const PCRE2_SIZE* span = pcre2_get_ovector_pointer(match);
    if (span[1] == span[0]) {  // an empty match takes nothing: step over one code point
      from = span[0] + decode_utf8(text, span[0]).length;
      continue;
    }
    if (span[0] > done) pieces.emplace_back(text, done, span[0] - done);
    pieces.emplace_back(text, span[0], span[1] - span[0]);
    done = from = span[1];
  }
  pcre2_match_data_free(match);
  if (done < text.size()) pieces.emplace_back(text, done, text.size() - done);
  return pieces;
}

std::string nfc_normalize(const std::string& text) {
  std::string out;
  size_t run = 0;  // start of the current valid run
  auto flush = [&](size_t end) {
    if (end == run) return;
    utf8proc_uint8_t* normalized = nullptr;
    const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data() + run),
                                            static_cast<utf8proc_ssize_t>(end - run), &normalized,
                                            static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
    require(n >= 0, "NFC normalization failed (", utf8proc_errmsg(n), ")");
    out.append(reinterpret_cast<const char*>(normalized), static_cast<size_t>(n));
    free(normalized);
  };
  for (size_t pos = 0; pos < text.size();) {
    const CodePoint cp = decode_utf8(text, pos);
    if (!cp.valid) {
      flush(pos);
      out += text[pos];
      run = pos + 1;
    }
    pos += cp.length;
  }
  flush(text.size());
  return out;
}

#else

struct RegexSplit::Compiled {};

RegexSplit::RegexSplit(const std::string&, const std::string& where) {
  fail(where, ": this tessera was built without PCRE2, which Hugging Face's pre-tokenizer patterns need "
       "(Debian: apt-get install libpcre2-dev libutf8proc-dev, as scripts/install.sh does; then rebuild)");
}

std::vector<std::string> RegexSplit::operator()(const std::string&) const { return {}; }

std::string nfc_normalize(const std::string&) {
  fail("this tessera was built without utf8proc, which NFC normalization needs (Debian: apt-get install "
       "libutf8proc-dev, as scripts/install.sh does; then rebuild)");
}

#endif

RegexSplit::~RegexSplit() = default;
RegexSplit::RegexSplit(RegexSplit&&) noexcept = default;

}  // namespace tessera
