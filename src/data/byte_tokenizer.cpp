// The byte tokenizer: token = byte value, vocab 256. Used for the bundled KJV corpus, where it
// needs no vocabulary file and any byte string round-trips exactly.
#include "core/error.h"
#include "data/tokenizer.h"

namespace tessera {
namespace {

class ByteTokenizer : public Tokenizer {
 public:
  std::vector<int64_t> encode(const std::string& text) const override {
    std::vector<int64_t> tokens(text.size());
    for (size_t i = 0; i < text.size(); ++i) tokens[i] = static_cast<unsigned char>(text[i]);
    return tokens;
  }

  std::string decode(const std::vector<int64_t>& tokens) const override {
    std::string text(tokens.size(), '\0');
    for (size_t i = 0; i < tokens.size(); ++i) {
      require(tokens[i] >= 0 && tokens[i] < 256, "byte tokenizer: token ", tokens[i], " is outside the vocab of 256");
      text[i] = static_cast<char>(tokens[i]);
    }
    return text;
  }

  int64_t vocab_size() const override { return 256; }
  std::string type() const override { return "byte"; }
};

}  // namespace

std::unique_ptr<Tokenizer> make_byte_tokenizer() { return std::make_unique<ByteTokenizer>(); }

}  // namespace tessera
