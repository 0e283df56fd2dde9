// A free port for a store that a launcher started by the test binds later (`--master
// 127.0.0.1:PORT`, MASTER_PORT, a NodeRendezvous), so the test cannot hold it open meanwhile.
//
// Not a probe of port 0: the kernel answers it from its ephemeral range (ip_local_port_range,
// 32768-60999 by default), the range every outgoing connection of the tests running beside this
// one (Gloo's, the stores' clients) takes its local port from, so one of them could take the port
// between the probe's close and the launcher's bind (seen under `make test`: "cannot listen on
// 127.0.0.1:43751 for the rendezvous store: Address already in use", and the other node waiting
// for the store until the test's deadline). Ports below that range are taken only by a bind. Each
// test process walks its own sequence of them, starting from its pid, and skips a port it cannot
// bind now; two processes meet on one port only if their sequences do within the moment between
// the check and the launcher's bind.
#pragma once

#include <unistd.h>

#include <fstream>

#include "comm/rendezvous.h"
#include "core/error.h"

namespace tessera::test {

inline int store_port() {
  constexpr int kLowest = 10000;
  int ephemeral_low = 32768;
  std::ifstream("/proc/sys/net/ipv4/ip_local_port_range") >> ephemeral_low;
  const int span = ephemeral_low - kLowest;
  require(span > 1000, "the ephemeral port range starts at ", ephemeral_low, ": no room below it for a test's store");
  static int next = static_cast<int>(::getpid() * 7919L % span);
  for (int tries = 0; tries < 200; ++tries) {
    const int port = kLowest + next;
    next = (next + 101) % span;
    try {
      const comm::ListenSocket probe = comm::listen_on("127.0.0.1", port);
      ::close(probe.fd);
      return port;
    } catch (const Error&) {
    }
  }
  fail("no free port below the ephemeral range (", kLowest, "-", ephemeral_low - 1, ") after 200 tries");
}

}  // namespace tessera::test
