// UTF-8 decoding for the tokenizers: one code point at a time, an invalid byte decoding alone (as
// Python's surrogateescape would keep it), so that any byte string can be walked and round-trips.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace tessera {

struct CodePoint {
  uint32_t value;  // the code point; the byte itself when !valid
  size_t length;   // bytes it takes (1 when !valid)
  bool valid;
};

// The code point at text[pos] (pos < text.size()). Overlong forms, surrogates, values past
// U+10FFFF and truncated sequences are invalid: their first byte decodes alone.
inline CodePoint decode_utf8(const std::string& text, size_t pos) {
  auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char b0 = byte(pos);
  if (b0 < 0x80) return {b0, 1, true};
  const size_t length = b0 >= 0xF0 && b0 <= 0xF4 ? 4 : b0 >= 0xE0 && b0 <= 0xEF ? 3 : b0 >= 0xC2 && b0 <= 0xDF ? 2 : 0;
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

}  // namespace tessera
