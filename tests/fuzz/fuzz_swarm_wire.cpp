// libFuzzer target: the swarm's TLS 1.3 channels (atom/wire.h) as either side sees the other,
// over a socket pair. The first byte (mod 2) picks the side:
//   0  the server (Channel::accept): the input is what a connecting peer sends, from its first
//      byte (a ClientHello, plaintext, garbage, a TLS 1.2 hello, a truncated record);
//   1  the client (Channel::open_as_client, connect()'s handshake): the input is what the peer it
//      dialled answers.
// The rest of the input is written and the pair's write side shut before the handshake reads
// it, so every read ends at the stream's end (never at the deadline). Nothing here holds the
// swarm's key, so every input must end in WireError: a handshake that completes would be one
// made without the PSK.
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "atom/wire.h"
#include "core/error.h"
#include "fuzz_swarm_key.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string stream(reinterpret_cast<const char*>(data) + 1, size - 1);
  const bool client = data[0] % 2 == 1;
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, pair) != 0) __builtin_trap();
  // The stream fits the socket's buffer (inputs are at most a few kilobytes).
  if (!stream.empty() && ::write(pair[0], stream.data(), stream.size()) != static_cast<ssize_t>(stream.size()))
    __builtin_trap();
  ::shutdown(pair[0], SHUT_WR);
  bool completed = false;
  try {
    if (client)
      tessera::atom::Channel::open_as_client(pair[1], "fuzz", tessera::fuzz::swarm_key(), "client", tessera::atom::Deadline::in(5), 1 << 20);
    else
      tessera::atom::Channel::accept(pair[1], "fuzz", tessera::fuzz::swarm_key(), "server", tessera::atom::Deadline::in(5), 1 << 20);
    completed = true;
  } catch (const tessera::atom::WireError&) {
  }
  ::close(pair[0]);
  if (completed) __builtin_trap();  // a handshake completed without the key
  return 0;
}
