// libFuzzer target: the swarm's handshake and message framing (atom/wire.h) as either side sees
// them from the other, over a socket pair. The first byte (mod 6) picks the side and the input:
// as the server (Channel::accept), what a connecting peer sends:
//   0  its whole byte stream, raw;
//   1  the bodies of a HELLO and a PROOF (split where the second byte says), framed correctly, so
//      the input reaches the HELLO's fields (magic, id, nonce) and the PROOF's checks;
//   2  what follows a well-formed HELLO, raw (the frames after it: headers, lengths, the PROOF);
// as the client (Channel::open_as_client, connect()'s handshake), what the peer it dialled sends:
//   3  its whole byte stream, raw;
//   4  the body of a CHALLENGE, framed correctly (the server id, nonce and proof checks);
//   5  what follows a CHALLENGE's well-formed id and nonce: the proof and the bytes after it, raw.
// The stream is written and the pair's write side shut before the handshake reads it, so every
// read ends at the stream's end (never at the deadline). Nothing here holds the swarm's key, so
// every input must end in WireError: a handshake that completes would be a forged proof.
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "atom/swarm_key.h"
#include "atom/wire.h"
#include "core/error.h"

namespace {

const tessera::atom::SwarmKey& key() {
  static const tessera::atom::SwarmKey k = tessera::atom::SwarmKey::from_bytes(std::string(32, 'k'));
  return k;
}

// A frame before the session: type, sequence and length (little-endian u64s), then the body.
std::string frame(uint8_t type, uint64_t sequence, const std::string& body) {
  std::string out(1, static_cast<char>(type));
  for (uint64_t v : {sequence, static_cast<uint64_t>(body.size())})
    for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  return out + body;
}

constexpr uint8_t kHello = 240, kChallenge = 241, kProof = 242;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const std::string rest(reinterpret_cast<const char*>(data) + 2, size - 2);
  std::string stream;
  const bool client = data[0] % 6 >= 3;
  switch (data[0] % 3) {
    case 0:
      stream = std::string(reinterpret_cast<const char*>(data) + 1, size - 1);
      break;
    case 1: {
      const size_t split = rest.size() * data[1] / 255;
      stream = client ? frame(kChallenge, 0, rest)
                      : frame(kHello, 0, rest.substr(0, split)) + frame(kProof, 1, rest.substr(split));
      break;
    }
    default:
      stream = client ? frame(kChallenge, 0, std::string(1, '\x06') + "server" + std::string(32, 's') + rest)
                      : frame(kHello, 0, "TSWM1" + std::string(1, '\x06') + "client" + std::string(32, 'n')) + rest;
  }
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, pair) != 0) __builtin_trap();
  // The stream fits the socket's buffer (inputs are at most 4096 bytes plus two frame headers).
  if (::write(pair[0], stream.data(), stream.size()) != static_cast<ssize_t>(stream.size())) __builtin_trap();
  ::shutdown(pair[0], SHUT_WR);
  bool completed = false;
  try {
    if (client)
      tessera::atom::Channel::open_as_client(pair[1], "fuzz", key(), "client", tessera::atom::Deadline::in(5), 1 << 20);
    else
      tessera::atom::Channel::accept(pair[1], "fuzz", key(), "server", tessera::atom::Deadline::in(5), 1 << 20);
    completed = true;
  } catch (const tessera::atom::WireError&) {
  }
  ::close(pair[0]);
  if (completed) __builtin_trap();  // a proof made without the key was taken
  return 0;
}
