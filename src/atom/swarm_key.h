// The swarm's shared key, and what a peer proves with it (atom/wire.h, atom/peer_record.h).
//
// A key file holds at least 32 random bytes as hexadecimal text (64 digits or more; whitespace
// around them ignored): `tessera swarm keygen --out FILE` writes one with mode 0600. The key never
// travels: peers prove they know it through TLS 1.3's handshake with a pre-shared key derived from
// it (wire.h), and sign their DHT records with HMAC-SHA256 tags (OpenSSL), compared in constant
// time.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

namespace tessera::atom {

using Tag = std::array<uint8_t, 32>;  // an HMAC-SHA256 tag

class SwarmKey {
 public:
  // Reads and checks `path` (named in every error, as is `swarm.key_file`): a regular file of hex
  // text encoding at least 32 bytes.
  static SwarmKey load(const std::string& path);
  // Writes a new key of 32 random bytes to `path` (mode 0600); refuses an existing file.
  static void generate(const std::string& path);
  // A key from raw bytes (tests); at least 16 bytes.
  static SwarmKey from_bytes(std::string_view bytes);

  Tag tag(std::string_view message) const;
  // The tag of the parts' concatenation, without joining them (a large message's header and body).
  Tag tag(std::initializer_list<std::string_view> parts) const;
  // A short public name of the key (the first 8 hex digits of HMAC(key, "id")): logs and records
  // say which key a swarm uses without revealing it.
  std::string fingerprint() const;

 private:
  explicit SwarmKey(std::string_view bytes) : bytes_(bytes) {}
  std::string bytes_;
};

// Constant-time comparison of two byte strings (unequal sizes differ).
bool same_bytes(std::string_view a, std::string_view b);
// `n` bytes from the system's cryptographic generator.
std::string random_bytes(size_t n);
std::string to_hex(std::string_view bytes);

}  // namespace tessera::atom
