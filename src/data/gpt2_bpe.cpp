// GPT-2 byte-level BPE (see gpt2_bpe.h): the file loaders, the hand-written pre-tokeniser and the
// rank-ordered merge loop of encoder.py's Encoder.bpe.
#include "data/gpt2_bpe.h"

#include <algorithm>
#include <array>
#include <iterator>
#include <limits>
#include <map>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fs.h"

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

// encoder.py's bytes_to_unicode: byte -> code point of a printable stand-in character.
std::array<uint32_t, 256> byte_to_code_point() {
  std::array<uint32_t, 256> map{};
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    map[b] = printable ? b : next++;
  }
  return map;
}

// One decoded UTF-8 code point at text[pos]; an invalid byte decodes alone as `valid = false`.
struct CodePoint {
  uint32_t value;
  size_t length;
  bool valid;
};

CodePoint decode_utf8(const std::string& text, size_t pos) {
  auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  unsigned char b0 = byte(pos);
  if (b0 < 0x80) return {b0, 1, true};
  size_t length = b0 >= 0xF0 && b0 <= 0xF4 ? 4 : b0 >= 0xE0 && b0 <= 0xEF ? 3 : b0 >= 0xC2 && b0 <= 0xDF ? 2 : 0;
  if (length == 0 || pos + length > text.size()) return {b0, 1, false};
  uint32_t value = b0 & (0x7F >> length);
  for (size_t i = 1; i < length; ++i) {
    if ((byte(pos + i) & 0xC0) != 0x80) return {b0, 1, false};
    value = (value << 6) | (byte(pos + i) & 0x3F);
  }
  static constexpr uint32_t kMinimum[] = {0, 0, 0x80, 0x800, 0x10000};
  if (value < kMinimum[length] || value > 0x10FFFF || (value >= 0xD800 && value <= 0xDFFF)) return {b0, 1, false};
  return {value, length, true};
}

// A symbol of encoder.json / vocab.bpe (stand-in characters) back to raw bytes; throws naming `where`.
std::string symbol_to_bytes(const std::string& symbol, const std::string& where) {
  static const std::array<int, 512> to_byte = [] {
    std::array<int, 512> inverse;
    inverse.fill(-1);
    auto map = byte_to_code_point();
    for (int b = 0; b < 256; ++b) inverse[map[b]] = b;
    return inverse;
  }();
  std::string out;
  for (size_t pos = 0; pos < symbol.size();) {
    CodePoint cp = decode_utf8(symbol, pos);
    require(cp.valid && cp.value < 512 && to_byte[cp.value] >= 0, where, ": '", symbol,
            "' is not in GPT-2's byte-to-unicode alphabet");
    out += static_cast<char>(to_byte[cp.value]);
    pos += cp.length;
  }
  return out;
}

// Key of the merge pair (a, b): the length of a makes the split unambiguous for any bytes.
std::string pair_key(const std::string& a, const std::string& b) { return std::to_string(a.size()) + ":" + a + b; }

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

Gpt2Bpe::Gpt2Bpe(const std::string& encoder_json, const std::string& vocab_bpe, int64_t vocab_size)
    : encoder_path_(encoder_json) {
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(read_file(encoder_json));
  } catch (const nlohmann::json::exception& e) {
    fail(encoder_json, ": not valid JSON (", e.what(), ")");
  }
  require(json.is_object() && !json.empty(), encoder_json, ": must be a non-empty object of token -> id");
  int64_t largest = -1;
  std::map<int64_t, std::string> owner;  // id -> the symbol that holds it
  for (const auto& [symbol, id] : json.items()) {
    require(id.is_number_integer() && id.get<int64_t>() >= 0, encoder_json, ": id of '", symbol,
            "' must be a non-negative integer");
    const int64_t value = id.get<int64_t>();
    const auto [held, fresh] = owner.emplace(value, symbol);
    require(fresh, encoder_json, ": tokens '", held->second, "' and '", symbol, "' share id ", value,
            " (a token id must decode to one text)");
    largest = std::max(largest, value);
    require(encoder_.emplace(symbol_to_bytes(symbol, encoder_json), value).second, encoder_json, ": token '", symbol,
            "' (id ", value, ") stands for the same bytes as another token");
  }
  // Without a vocabulary size the ids are GPT-2's dense 0 .. tokens - 1: a larger id is refused
  // here, before a decoder table of its size is allocated.
  const auto tokens = static_cast<int64_t>(json.size());
  require(vocab_size > 0 || largest < tokens, encoder_json, ": id ", largest, " is not below the number of tokens ",
          tokens, " (a GPT-2 encoder numbers its tokens 0 .. ", tokens - 1, ")");
  vocab_size_ = vocab_size > 0 ? vocab_size : largest + 1;
  require(largest < vocab_size_, encoder_json, ": id ", largest, " is not below vocab_size ", vocab_size_);
  // Ids past the encoder's are padding (a vocabulary rounded up for the model's matrices); a
  // vocab_size far past them is a wrong file, refused before a decoder table of its size exists.
  require(vocab_size_ - tokens <= kMaxVocabPadding, encoder_json, ": vocab_size ", vocab_size_,
          " (tokenizer.json) exceeds its ", tokens, " tokens by more than ", kMaxVocabPadding,
          " (ids without a token)");
  decoder_.resize(static_cast<size_t>(vocab_size_));
  known_.assign(static_cast<size_t>(vocab_size_), false);
  for (const auto& [bytes, id] : encoder_) {
    decoder_[static_cast<size_t>(id)] = bytes;
    known_[static_cast<size_t>(id)] = true;
  }
  for (int b = 0; b < 256; ++b)
    require(encoder_.count(std::string(1, static_cast<char>(b))), encoder_json, ": no token for byte ", b,
            " (a byte-level vocabulary must cover all 256 bytes)");

  std::string merges = read_file(vocab_bpe);
  size_t line_no = 0;
  for (size_t pos = 0; pos < merges.size();) {
    size_t eol = std::min(merges.find('\n', pos), merges.size());
    std::string line = merges.substr(pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (line_no == 1 && line.rfind("#version", 0) == 0)) continue;
    size_t space = line.find(' ');
    require(space != std::string::npos && space > 0 && space + 1 < line.size() &&
                line.find(' ', space + 1) == std::string::npos,
            vocab_bpe, ":", line_no, ": a merge must be two symbols separated by one space (got '", line, "')");
    std::string where = vocab_bpe + ":" + std::to_string(line_no);
    ranks_.emplace(pair_key(symbol_to_bytes(line.substr(0, space), where),
                            symbol_to_bytes(line.substr(space + 1), where)),
                   static_cast<int64_t>(ranks_.size()));
  }
}

const std::vector<int64_t>& Gpt2Bpe::encode_piece(const std::string& piece) const {
  {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    auto hit = cache_.find(piece);
    if (hit != cache_.end()) return hit->second;
  }
  std::vector<std::string> word;
  for (char c : piece) word.emplace_back(1, c);
  while (word.size() > 1) {
    int64_t best_rank = std::numeric_limits<int64_t>::max();
    size_t best = 0;
    for (size_t i = 0; i + 1 < word.size(); ++i) {
      auto rank = ranks_.find(pair_key(word[i], word[i + 1]));
      if (rank != ranks_.end() && rank->second < best_rank) {
        best_rank = rank->second;
        best = i;
      }
    }
    if (best_rank == std::numeric_limits<int64_t>::max()) break;
    const std::string first = word[best], second = word[best + 1];
    std::vector<std::string> merged;
    for (size_t i = 0; i < word.size();) {
      if (i + 1 < word.size() && word[i] == first && word[i + 1] == second) {
        merged.push_back(first + second);
        i += 2;
      } else {
        merged.push_back(word[i++]);
      }
    }
    word = std::move(merged);
  }
  std::vector<int64_t> ids;
  for (const std::string& symbol : word) {
    auto id = encoder_.find(symbol);
    require(id != encoder_.end(), encoder_path_, ": no token for the merged symbol of ", symbol.size(), " bytes '",
            symbol, "'");
    ids.push_back(id->second);
  }
  std::lock_guard<std::mutex> lock(cache_mutex_);
  return cache_.emplace(piece, std::move(ids)).first->second;
}

std::vector<int64_t> Gpt2Bpe::encode(const std::string& text) const {
  std::vector<int64_t> ids;
  for (const std::string& piece : gpt2_pretokenize(text)) {
    const std::vector<int64_t>& piece_ids = encode_piece(piece);
    ids.insert(ids.end(), piece_ids.begin(), piece_ids.end());
  }
  return ids;
}

std::string Gpt2Bpe::decode(const std::vector<int64_t>& tokens) const {
  std::string text;
  for (int64_t id : tokens) {
    require(id >= 0 && id < vocab_size_ && known_[static_cast<size_t>(id)], encoder_path_, ": token id ", id,
            " is not in the vocabulary");
    text += decoder_[static_cast<size_t>(id)];
  }
  return text;
}

}  // namespace tessera
