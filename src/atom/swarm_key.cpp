// The swarm key: files, HMAC-SHA256 tags, nonces (swarm_key.h).
#include "atom/swarm_key.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <filesystem>

#include <openssl/crypto.h>
#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <openssl/rand.h>

#include "core/error.h"
#include "core/fs.h"

namespace tessera::atom {
namespace {

constexpr size_t kMinKeyBytes = 32;

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::string to_hex(std::string_view bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) {
    out.push_back(digits[b >> 4]);
    out.push_back(digits[b & 15]);
  }
  return out;
}

std::string random_bytes(size_t n) {
  std::string out(n, '\0');
  require(RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), static_cast<int>(n)) == 1,
          "the system's random generator failed (OpenSSL RAND_bytes)");
  return out;
}

bool same_bytes(std::string_view a, std::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

SwarmKey SwarmKey::load(const std::string& path) {
  require(!path.empty(), "swarm.key_file is not set: a swarm is closed to peers without its key; make one with "
                         "`tessera swarm keygen --out FILE` and give every peer the same file");
  require(std::filesystem::exists(path), "swarm.key_file ", path, " does not exist (make one with `tessera swarm "
                                         "keygen --out ", path, "`)");
  require_regular_file(path);
  const std::string text = read_file(path);
  require(text.size() <= 4096, "swarm.key_file ", path, " is ", text.size(), " bytes: not a key file (hex text)");
  std::string hex;
  for (char c : text) {
    if (std::isspace(static_cast<unsigned char>(c))) continue;
    require(hex_value(c) >= 0, "swarm.key_file ", path, ": a key file holds hexadecimal digits only");
    hex.push_back(c);
  }
  require(hex.size() % 2 == 0, "swarm.key_file ", path, ": an odd number of hex digits");
  std::string bytes;
  for (size_t i = 0; i < hex.size(); i += 2)
    bytes.push_back(static_cast<char>(hex_value(hex[i]) * 16 + hex_value(hex[i + 1])));
  require(bytes.size() >= kMinKeyBytes, "swarm.key_file ", path, " holds ", bytes.size(), " bytes; a swarm key has "
          "at least ", kMinKeyBytes, " (`tessera swarm keygen` writes one)");
  return SwarmKey(bytes);
}

void SwarmKey::generate(const std::string& path) {
  require(!std::filesystem::exists(path), path, " exists: a swarm key is never overwritten (peers holding it would "
          "be shut out); choose another path");
  const std::string text = to_hex(random_bytes(kMinKeyBytes)) + "\n";
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
  require(fd >= 0, "cannot create the key file ", path);
  const bool written = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) && ::fsync(fd) == 0;
  ::close(fd);
  require(written, "cannot write the key file ", path);
}

SwarmKey SwarmKey::from_bytes(std::string_view bytes) {
  require(bytes.size() >= 16, "internal: a swarm key of ", bytes.size(), " bytes");
  return SwarmKey(bytes);
}

Tag SwarmKey::tag(std::string_view message) const { return tag({message}); }

Tag SwarmKey::tag(std::initializer_list<std::string_view> parts) const {
  // OpenSSL 3's EVP_MAC interface (HMAC_CTX is deprecated there).
  struct Mac {
    EVP_MAC* mac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
    EVP_MAC_CTX* ctx = mac ? EVP_MAC_CTX_new(mac) : nullptr;
    ~Mac() {
      EVP_MAC_CTX_free(ctx);
      EVP_MAC_free(mac);
    }
  } m;
  char digest[] = "SHA256";
  const OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string("digest", digest, 0), OSSL_PARAM_construct_end()};
  bool ok = m.ctx && EVP_MAC_init(m.ctx, reinterpret_cast<const unsigned char*>(bytes_.data()), bytes_.size(), params);
  for (std::string_view part : parts)
    ok = ok && EVP_MAC_update(m.ctx, reinterpret_cast<const unsigned char*>(part.data()), part.size());
  Tag out{};
  size_t size = 0;
  ok = ok && EVP_MAC_final(m.ctx, out.data(), &size, out.size());
  require(ok && size == out.size(), "internal: HMAC-SHA256 failed (OpenSSL)");
  return out;
}

std::string SwarmKey::fingerprint() const {
  const Tag t = tag("tessera swarm key id");
  return to_hex(std::string_view(reinterpret_cast<const char*>(t.data()), 4));
}

}  // namespace tessera::atom
