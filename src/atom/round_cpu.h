// The CPU an averaging round costs per byte it sends (`tessera plan calibrate`: [peers]
// cpu_ns_per_byte, plan/swarm_cost.h prices it).
//
// `members` peers in this process, each with its own listener and averager on loopback (the swarm's
// own code: TLS 1.3 channels, atom/wire.h; the mean of three or more round a ring, else the
// butterfly; dense float32, atom/averaging.h), sum a vector of `elements` float32 values round
// after round. A first round opens the channels (its handshakes are not counted, as a swarm keeps
// its channels between rounds); the rounds after it run for about `seconds` (at least two), and
// the process's CPU time over them is divided by the bytes every member sent. Every byte sent is
// encrypted once and decrypted once in this process, so the figure is one byte's whole cost,
// sender's and receiver's: TLS both ways, the kernel's socket copies, the sums, the finiteness
// checks, the allocations. What the loopback's kernel work lacks against a real link (the NIC's
// driver, a veth pair and tbf qdisc here) is not in it.
#pragma once

#include <cstdint>

namespace tessera::atom {

double round_cpu_ns_per_byte(int64_t members, int64_t elements, double seconds);

}  // namespace tessera::atom
