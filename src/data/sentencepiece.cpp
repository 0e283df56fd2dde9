// SentencePiece BPE models read from protobuf's wire format and run (sentencepiece.h).
#include "data/sentencepiece.h"

#include <array>
#include <cstdio>
#include <cstring>
#include <queue>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "core/fs.h"
#include "data/utf8.h"

namespace tessera {
namespace {

const std::string kSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's visible space

enum PieceType { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6 };

// One protobuf message's fields, read one at a time.
class WireReader {
 public:
  WireReader(const std::string& bytes, const std::string& where) : data_(bytes), where_(where) {}
  bool next(int& field, int& wire) {
    if (pos_ >= data_.size()) return false;
    const uint64_t tag = varint();
    field = static_cast<int>(tag >> 3);
    wire = static_cast<int>(tag & 7);
    return true;
  }
  uint64_t varint() {
    uint64_t value = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      require(pos_ < data_.size(), where_, ": truncated (a varint runs past the end)");
      const auto byte = static_cast<unsigned char>(data_[pos_++]);
      value |= static_cast<uint64_t>(byte & 0x7F) << shift;
      if (!(byte & 0x80)) return value;
    }
    fail(where_, ": a varint longer than 10 bytes");
  }
  std::string bytes() {
    const uint64_t length = varint();
    require(length <= data_.size() - pos_, where_, ": truncated (a field of ", length, " bytes runs past the end)");
    std::string out = data_.substr(pos_, length);
    pos_ += length;
    return out;
  }
  float fixed32() {
    require(data_.size() - pos_ >= 4, where_, ": truncated (a 32-bit field runs past the end)");
    float value;
    std::memcpy(&value, data_.data() + pos_, 4);
    pos_ += 4;
    return value;
  }
  void skip(int wire) {
    if (wire == 0) varint();
    else if (wire == 1) skip_bytes(8);
    else if (wire == 2) bytes();
    else if (wire == 5) skip_bytes(4);
    else fail(where_, ": unknown protobuf wire type ", wire, " (not a SentencePiece model?)");
  }

 private:
  void skip_bytes(size_t n) {
    require(data_.size() - pos_ >= n, where_, ": truncated");
    pos_ += n;
  }
  const std::string& data_;
  std::string where_;
  size_t pos_ = 0;
};

struct Piece {
  std::string text;
  float score = 0;
  int type = kNormal;
  int byte = -1;  // the value of a <0xXX> byte piece
};

class SentencePieceBpe : public Tokenizer {
 public:
  explicit SentencePieceBpe(const std::string& path) : path_(path) {
    const std::string file = read_file(path);
    WireReader model(file, path);
    int field, wire;
    int model_type = 1;  // UNIGRAM, protobuf's default
    bool suffix = false;
    std::string charsmap, rule = "(unnamed)";
    while (model.next(field, wire)) {
      if (field == 1 && wire == 2) {
        const std::string bytes = model.bytes();
        WireReader piece(bytes, path + ": a piece");
        Piece p;
        while (piece.next(field, wire)) {
          if (field == 1 && wire == 2) p.text = piece.bytes();
          else if (field == 2 && wire == 5) p.score = piece.fixed32();
          else if (field == 3 && wire == 0) p.type = static_cast<int>(piece.varint());
          else piece.skip(wire);
        }
        pieces_.push_back(std::move(p));
      } else if (field == 2 && wire == 2) {
        const std::string bytes = model.bytes();
        WireReader spec(bytes, path + ": trainer_spec");
        while (spec.next(field, wire)) {
          if (field == 3 && wire == 0) model_type = static_cast<int>(spec.varint());
          else if (field == 35 && wire == 0) byte_fallback_ = spec.varint() != 0;
          else if (field == 40 && wire == 0) unk_id_ = static_cast<int64_t>(spec.varint());
          else if (field == 24 && wire == 0) suffix = spec.varint() != 0;
          else spec.skip(wire);
        }
      } else if (field == 3 && wire == 2) {
        const std::string bytes = model.bytes();
        WireReader spec(bytes, path + ": normalizer_spec");
        while (spec.next(field, wire)) {
          if (field == 1 && wire == 2) rule = spec.bytes();
          else if (field == 2 && wire == 2) charsmap = spec.bytes();
          else if (field == 3 && wire == 0) dummy_prefix_ = spec.varint() != 0;
          else if (field == 4 && wire == 0) remove_extra_ = spec.varint() != 0;
          else if (field == 5 && wire == 0) escape_ = spec.varint() != 0;
          else spec.skip(wire);
        }
      } else {
        model.skip(wire);
      }
    }
    require(!pieces_.empty(), path, ": no pieces (not a SentencePiece model?)");
    require(model_type == 2, path, ": trainer_spec.model_type ", model_type,
            " is not read (tessera runs SentencePiece's BPE models, type 2: Llama 2, Mistral)");
    require(charsmap.empty(), path, ": normalization rule '", rule,
            "' has a character map, which tessera does not apply (it reads the identity rule: Llama 2, Mistral)");
    require(!suffix, path, ": treat_whitespace_as_suffix = true is not read");
    require(unk_id_ >= 0 && unk_id_ < vocab_size(), path, ": unk_id ", unk_id_, " is not a piece");
    byte_ids_.fill(-1);
    for (size_t id = 0; id < pieces_.size(); ++id) {
      Piece& p = pieces_[id];
      if (p.type == kNormal || p.type == kUserDefined || p.type == kUnused) mergeable_.emplace(p.text, id);
      if (p.type == kUserDefined) user_defined_.push_back(p.text);
      if (p.type == kByte) {
        unsigned value = 0;
        require(p.text.size() == 6 && std::sscanf(p.text.c_str(), "<0x%02X>", &value) == 1, path, ": byte piece '",
                p.text, "' is not <0xXX>");
        byte_ids_[value] = static_cast<int64_t>(id);
        pieces_[id].byte = static_cast<int>(value);
      }
    }
    if (byte_fallback_)
      for (int b = 0; b < 256; ++b)
        require(byte_ids_[static_cast<size_t>(b)] >= 0, path, ": byte_fallback without a piece for byte ", b);
  }

  std::vector<int64_t> encode(const std::string& text) const override {
    const std::string normalized = normalize(text);
    std::vector<Symbol> symbols;
    for (size_t pos = 0; pos < normalized.size();) {
      size_t length = 0;
      for (const std::string& u : user_defined_)
        if (u.size() > length && normalized.compare(pos, u.size(), u) == 0) length = u.size();
      if (length == 0) length = decode_utf8(normalized, pos).length;
      symbols.push_back({normalized.substr(pos, length), static_cast<int>(symbols.size()) - 1,
                         static_cast<int>(symbols.size()) + 1});
      pos += length;
    }
    if (!symbols.empty()) symbols.back().next = -1;
    struct Pair {
      float score;
      int left, right;
      size_t size;
    };
    auto worse = [](const Pair& a, const Pair& b) { return a.score < b.score || (a.score == b.score && a.left > b.left); };
    std::priority_queue<Pair, std::vector<Pair>, decltype(worse)> agenda(worse);
    auto consider = [&](int left, int right) {
      if (left < 0 || right < 0) return;
      const auto it = mergeable_.find(symbols[static_cast<size_t>(left)].text + symbols[static_cast<size_t>(right)].text);
      if (it == mergeable_.end() || pieces_[it->second].type == kUnused) return;
      agenda.push({pieces_[it->second].score, left, right,
                   symbols[static_cast<size_t>(left)].text.size() + symbols[static_cast<size_t>(right)].text.size()});
    };
    for (size_t i = 1; i < symbols.size(); ++i) consider(static_cast<int>(i) - 1, static_cast<int>(i));
    while (!agenda.empty()) {
      const Pair top = agenda.top();
      agenda.pop();
      Symbol& left = symbols[static_cast<size_t>(top.left)];
      Symbol& right = symbols[static_cast<size_t>(top.right)];
      if (left.text.empty() || right.text.empty() || left.text.size() + right.text.size() != top.size) continue;
      left.text += right.text;
      right.text.clear();
      left.next = right.next;
      if (right.next >= 0) symbols[static_cast<size_t>(right.next)].prev = top.left;
      consider(left.prev, top.left);
      consider(top.left, left.next);
    }
    std::vector<int64_t> ids;
    for (int i = symbols.empty() ? -1 : 0; i >= 0; i = symbols[static_cast<size_t>(i)].next) {
      const std::string& s = symbols[static_cast<size_t>(i)].text;
      const auto it = mergeable_.find(s);
      if (it != mergeable_.end()) {
        ids.push_back(static_cast<int64_t>(it->second));
      } else if (byte_fallback_) {
        for (unsigned char b : s) ids.push_back(byte_ids_[b]);
      } else {
        ids.push_back(unk_id_);
      }
    }
    return ids;
  }

  std::string decode(const std::vector<int64_t>& tokens) const override {
    std::string text;
    bool first = true;
    for (int64_t id : tokens) {
      require(id >= 0 && id < vocab_size(), path_, ": token id ", id, " is not in the vocabulary");
      const Piece& p = pieces_[static_cast<size_t>(id)];
      if (p.type == kControl) continue;
      std::string piece = p.type == kByte ? std::string(1, static_cast<char>(p.byte))
                          : p.type == kUnknown ? std::string(" \xE2\x81\x87 ")
                                               : p.text;
      if (escape_)
        for (size_t at = piece.find(kSpace); at != std::string::npos; at = piece.find(kSpace, at + 1))
          piece.replace(at, kSpace.size(), " ");
      if (first && dummy_prefix_ && !piece.empty() && piece[0] == ' ' && p.type != kByte) piece.erase(0, 1);
      first = false;
      text += piece;
    }
    return text;
  }

  int64_t vocab_size() const override { return static_cast<int64_t>(pieces_.size()); }
  std::string type() const override { return "sentencepiece"; }

 private:
  struct Symbol {
    std::string text;
    int prev, next;
  };

  std::string normalize(const std::string& text) const {
    std::string t = text;
    if (remove_extra_) {
      std::string collapsed;
      for (char c : t)
        if (c != ' ' || (!collapsed.empty() && collapsed.back() != ' ')) collapsed += c;
      while (!collapsed.empty() && collapsed.back() == ' ') collapsed.pop_back();
      t = collapsed;
    }
    if (t.empty()) return t;
    if (dummy_prefix_) t = " " + t;
    if (!escape_) return t;
    std::string escaped;
    for (char c : t) escaped += c == ' ' ? kSpace : std::string(1, c);
    return escaped;
  }

  std::string path_;
  std::vector<Piece> pieces_;
  std::unordered_map<std::string, size_t> mergeable_;  // normal, user-defined and unused pieces -> id
  std::vector<std::string> user_defined_;
  std::array<int64_t, 256> byte_ids_{};
  int64_t unk_id_ = 0;
  bool byte_fallback_ = false, dummy_prefix_ = true, remove_extra_ = true, escape_ = true;
};

}  // namespace

std::unique_ptr<Tokenizer> load_sentencepiece(const std::string& model_path) {
  return std::make_unique<SentencePieceBpe>(model_path);
}

}  // namespace tessera
