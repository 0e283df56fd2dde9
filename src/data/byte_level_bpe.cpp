// Byte-level BPE (byte_level_bpe.h): the checks of a vocabulary, the added tokens' cut, and the
// rank-ordered merge loop of GPT-2's encoder.py (Encoder.bpe).
#include "data/byte_level_bpe.h"

#include <algorithm>
#include <array>
#include <limits>
#include <map>

#include "core/error.h"
#include "data/utf8.h"

namespace tessera {
namespace {

// encoder.py's bytes_to_unicode: byte -> code point of a printable stand-in character.
std::array<uint32_t, 256> byte_to_code_point() {
  std::array<uint32_t, 256> map{};
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    map[b] = printable ? b : next++;
  }
  return map;
}

// Key of the merge pair (a, b): the length of a makes the split unambiguous for any bytes.
std::string pair_key(const std::string& a, const std::string& b) { return std::to_string(a.size()) + ":" + a + b; }

}  // namespace

std::string byte_level_bytes(const std::string& symbol, const std::string& where) {
  static const std::array<int, 512> to_byte = [] {
    std::array<int, 512> inverse;
    inverse.fill(-1);
    const auto map = byte_to_code_point();
    for (int b = 0; b < 256; ++b) inverse[map[b]] = b;
    return inverse;
  }();
  std::string out;
  for (size_t pos = 0; pos < symbol.size();) {
    const CodePoint cp = decode_utf8(symbol, pos);
    require(cp.valid && cp.value < 512 && to_byte[cp.value] >= 0, where, ": '", symbol,
            "' is not in GPT-2's byte-to-unicode alphabet");
    out += static_cast<char>(to_byte[cp.value]);
    pos += cp.length;
  }
  return out;
}

ByteLevelBpe::ByteLevelBpe(Spec spec)
    : source_(std::move(spec.source)),
      type_(std::move(spec.type)),
      ignore_merges_(spec.ignore_merges),
      pretokenize_(std::move(spec.pretokenize)),
      normalize_(std::move(spec.normalize)) {
  require(!spec.vocabulary.empty(), source_, ": the vocabulary is empty");
  int64_t largest = -1;
  std::map<int64_t, std::string> owner;  // id -> the text that holds it
  auto claim = [&](const std::string& text, int64_t id) {
    require(id >= 0, source_, ": id ", id, " of '", text, "' is negative");
    const auto [held, fresh] = owner.emplace(id, text);
    require(fresh, source_, ": tokens '", held->second, "' and '", text, "' share id ", id,
            " (a token id must decode to one text)");
    largest = std::max(largest, id);
  };
  for (const auto& [bytes, id] : spec.vocabulary) {
    claim(bytes, id);
    require(encoder_.emplace(bytes, id).second, source_, ": token '", bytes, "' (id ", id,
            ") stands for the same bytes as another token");
  }
  for (const auto& [text, id] : spec.added) {
    require(!text.empty(), source_, ": added token ", id, " has no text");
    const auto it = encoder_.find(text);
    if (it == encoder_.end() || it->second != id) claim(text, id);  // an added token may repeat a vocabulary entry
    added_.emplace_back(text, id);
  }
  std::stable_sort(added_.begin(), added_.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  added_by_byte_.resize(256);
  for (size_t i = 0; i < added_.size(); ++i)
    added_by_byte_[static_cast<unsigned char>(added_[i].first[0])].push_back(i);
  // Without a vocabulary size and with dense ids (GPT-2's encoder.json) a larger id is refused
  // here, before a decoder table of its size is allocated.
  const auto tokens = static_cast<int64_t>(owner.size());
  require(spec.vocab_size > 0 || !spec.dense_ids || largest < tokens, source_, ": id ", largest,
          " is not below the number of tokens ", tokens, " (a GPT-2 encoder numbers its tokens 0 .. ", tokens - 1, ")");
  // Without a vocabulary size, an id far past the tokens is refused before largest + 1 (which
  // overflows at 2^63 - 1) becomes the size.
  require(spec.vocab_size > 0 || largest - tokens < kMaxVocabPadding, source_, ": id ", largest, " exceeds its ", tokens,
          " tokens by more than ", kMaxVocabPadding, " (ids without a token)");
  vocab_size_ = spec.vocab_size > 0 ? spec.vocab_size : largest + 1;
  require(largest < vocab_size_, source_, ": id ", largest, " is not below vocab_size ", vocab_size_);
  // Ids past the tokens are padding (a vocabulary rounded up for the model's matrices); a
  // vocab_size far past them is a wrong file, refused before a decoder table of its size exists.
  require(vocab_size_ - tokens <= kMaxVocabPadding, source_, ": vocab_size ", vocab_size_, " exceeds its ", tokens,
          " tokens by more than ", kMaxVocabPadding, " (ids without a token)");
  decoder_.resize(static_cast<size_t>(vocab_size_));
  known_.assign(static_cast<size_t>(vocab_size_), false);
  for (const auto& [id, text] : owner) {
    decoder_[static_cast<size_t>(id)] = text;
    known_[static_cast<size_t>(id)] = true;
  }
  for (int b = 0; b < 256; ++b)
    require(encoder_.count(std::string(1, static_cast<char>(b))), source_, ": no token for byte ", b,
            " (a byte-level vocabulary must cover all 256 bytes)");
  for (const auto& [a, b] : spec.merges) ranks_.emplace(pair_key(a, b), static_cast<int64_t>(ranks_.size()));
}

const std::vector<int64_t>& ByteLevelBpe::encode_piece(const std::string& piece) const {
  {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    const auto hit = cache_.find(piece);
    if (hit != cache_.end()) return hit->second;
  }
  std::vector<std::string> word;
  const auto whole = ignore_merges_ ? encoder_.find(piece) : encoder_.end();
  if (whole != encoder_.end()) word.push_back(piece);
  else
    for (char c : piece) word.emplace_back(1, c);
  while (word.size() > 1) {
    int64_t best_rank = std::numeric_limits<int64_t>::max();
    size_t best = 0;
    for (size_t i = 0; i + 1 < word.size(); ++i) {
      const auto rank = ranks_.find(pair_key(word[i], word[i + 1]));
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
    const auto id = encoder_.find(symbol);
    require(id != encoder_.end(), source_, ": no token for the merged symbol of ", symbol.size(), " bytes '", symbol,
            "'");
    ids.push_back(id->second);
  }
  std::lock_guard<std::mutex> lock(cache_mutex_);
  return cache_.emplace(piece, std::move(ids)).first->second;
}

void ByteLevelBpe::encode_text(const std::string& text, std::vector<int64_t>& ids) const {
  if (text.empty()) return;
  for (const std::string& piece : pretokenize_(normalize_ ? normalize_(text) : text)) {
    const std::vector<int64_t>& piece_ids = encode_piece(piece);
    ids.insert(ids.end(), piece_ids.begin(), piece_ids.end());
  }
}

std::vector<int64_t> ByteLevelBpe::encode(const std::string& text) const {
  std::vector<int64_t> ids;
  size_t done = 0;
  for (size_t pos = 0; pos < text.size() && !added_.empty(); ++pos) {
    for (size_t index : added_by_byte_[static_cast<unsigned char>(text[pos])]) {
      const auto& [added, id] = added_[index];
      if (text.compare(pos, added.size(), added) != 0) continue;
      encode_text(text.substr(done, pos - done), ids);
      ids.push_back(id);
      done = pos + added.size();
      pos = done - 1;
      break;
    }
  }
  encode_text(text.substr(done), ids);
  return ids;
}

std::string ByteLevelBpe::decode(const std::vector<int64_t>& tokens) const {
  std::string text;
  for (int64_t id : tokens) {
    require(id >= 0 && id < vocab_size_ && known_[static_cast<size_t>(id)], source_, ": token id ", id,
            " is not in the vocabulary");
    text += decoder_[static_cast<size_t>(id)];
  }
  return text;
}

}  // namespace tessera
