// GPT-2 byte-level BPE (see gpt2_bpe.h): the hand-written pre-tokeniser and the reader of
// encoder.json and vocab.bpe (the merge loop is byte_level_bpe.cpp's).
#include "data/gpt2_bpe.h"

#include <algorithm>
#include <iterator>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fs.h"
#include "data/utf8.h"

namespace tessera {
namespace {

struct ClassRange {
  uint32_t lo, hi;
  Gpt2CharClass cls;
};
constexpr Gpt2CharClass N = Gpt2CharClass::Number, S = Gpt2CharClass::Space, O = Gpt2CharClass::Other;
constexpr ClassRange kNonLetterRanges[] = {
#include "data/gpt2_unicode_table.inc"
};

}  // namespace

Gpt2CharClass gpt2_char_class(uint32_t cp) {
  if (cp < 0x80) {
    if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z')) return Gpt2CharClass::Letter;
    if (cp >= '0' && cp <= '9') return Gpt2CharClass::Number;
    if (cp == ' ' || (cp >= '\t' && cp <= '\r')) return Gpt2CharClass::Space;
    return Gpt2CharClass::Other;
  }
  auto it = std::upper_bound(std::begin(kNonLetterRanges), std::end(kNonLetterRanges), cp,
                             [](uint32_t value, const ClassRange& r) { return value < r.lo; });
  if (it == std::begin(kNonLetterRanges)) return Gpt2CharClass::Letter;
  --it;
  return cp <= it->hi ? it->cls : Gpt2CharClass::Letter;
}

std::vector<std::string> gpt2_pretokenize(const std::string& text) {
  struct Unit {
    size_t begin;
    uint32_t cp;
    Gpt2CharClass cls;
  };
  std::vector<Unit> units;
  for (size_t pos = 0; pos < text.size();) {
    CodePoint cp = decode_utf8(text, pos);
    units.push_back({pos, cp.value, cp.valid ? gpt2_char_class(cp.value) : Gpt2CharClass::Other});
    pos += cp.length;
  }
  const size_t n = units.size();
  auto begin_of = [&](size_t i) { return i < n ? units[i].begin : text.size(); };
  auto is = [&](size_t i, char c) { return i < n && units[i].cp == static_cast<unsigned char>(c); };
  auto run_end = [&](size_t i, Gpt2CharClass cls) {
    while (i < n && units[i].cls == cls) ++i;
    return i;
  };

  std::vector<std::string> pieces;
  for (size_t i = 0; i < n;) {
    size_t end = i;
    const size_t j = is(i, ' ') ? i + 1 : i;  // the optional leading space of the class alternatives
    if (is(i, '\'') && (is(i + 1, 's') || is(i + 1, 't') || is(i + 1, 'm') || is(i + 1, 'd'))) {
      end = i + 2;
    } else if (is(i, '\'') && ((is(i + 1, 'r') && is(i + 2, 'e')) || (is(i + 1, 'v') && is(i + 2, 'e')) ||
                               (is(i + 1, 'l') && is(i + 2, 'l')))) {
      end = i + 3;
    } else if (j < n && units[j].cls != Gpt2CharClass::Space) {
      end = run_end(j, units[j].cls);  // ` ?\p{L}+`, ` ?\p{N}+` or ` ?[^\s\p{L}\p{N}]+`
    } else {
      // A whitespace run: `\s+(?!\S)` keeps its last character for the next piece when a
      // non-space follows and the run is longer than one; otherwise `\s+` takes it all.
      size_t k = run_end(i, Gpt2CharClass::Space);
      end = (k < n && k - i >= 2) ? k - 1 : k;
    }
    pieces.emplace_back(text, begin_of(i), begin_of(end) - begin_of(i));
    i = end;
  }
  return pieces;
}

namespace {

ByteLevelBpe::Spec read_gpt2_files(const std::string& encoder_json, const std::string& vocab_bpe, int64_t vocab_size) {
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(read_file(encoder_json));
  } catch (const nlohmann::json::exception& e) {
    fail(encoder_json, ": not valid JSON (", e.what(), ")");
  }
  require(json.is_object() && !json.empty(), encoder_json, ": must be a non-empty object of token -> id");
  ByteLevelBpe::Spec spec;
  spec.source = encoder_json;
  spec.type = "gpt2";
  spec.vocab_size = vocab_size;
  spec.dense_ids = true;
  spec.pretokenize = gpt2_pretokenize;
  for (const auto& [symbol, id] : json.items()) {
    require(id.is_number_integer() && id.get<int64_t>() >= 0, encoder_json, ": id of '", symbol,
            "' must be a non-negative integer");
    spec.vocabulary.emplace_back(byte_level_bytes(symbol, encoder_json), id.get<int64_t>());
  }
  const std::string merges = read_file(vocab_bpe);
  size_t line_no = 0;
  for (size_t pos = 0; pos < merges.size();) {
    const size_t eol = std::min(merges.find('\n', pos), merges.size());
    std::string line = merges.substr(pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (line_no == 1 && line.rfind("#version", 0) == 0)) continue;
    const size_t space = line.find(' ');
    require(space != std::string::npos && space > 0 && space + 1 < line.size() &&
                line.find(' ', space + 1) == std::string::npos,
            vocab_bpe, ":", line_no, ": a merge must be two symbols separated by one space (got '", line, "')");
    const std::string where = vocab_bpe + ":" + std::to_string(line_no);
    spec.merges.emplace_back(byte_level_bytes(line.substr(0, space), where),
                             byte_level_bytes(line.substr(space + 1), where));
  }
  return spec;
}

}  // namespace

Gpt2Bpe::Gpt2Bpe(const std::string& encoder_json, const std::string& vocab_bpe, int64_t vocab_size)
    : ByteLevelBpe(read_gpt2_files(encoder_json, vocab_bpe, vocab_size)) {}

}  // namespace tessera
