// libFuzzer target: every message a swarm peer parses from another peer once a channel is open
// (atom/messages.h: JOIN, GROUP, PART, SUM, the state offer, the chunk and round requests), a part's
// payload decoded in each codec, dense and sparse, and a DHT peer record (atom/peer_record.h) signed with the
// swarm's key so the input reaches the checks behind the tag. The first byte picks the parser;
// each input must parse or end in tessera::Error (WireError), and what parses must hold the
// ranges messages.h promises.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include <ATen/ATen.h>

#include "atom/messages.h"
#include "atom/peer_record.h"
#include "core/error.h"
#include "fuzz_swarm_key.h"

namespace {

void check(bool ok) {
  if (!ok) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  using namespace tessera::atom;
  const std::string body(reinterpret_cast<const char*>(data) + 2, size - 2);
  const Codec codec = static_cast<Codec>(data[1] % 3);
  const PartEncoding encoding{codec, (data[1] / 3) % 2 == 1, 1.0};
  try {
    switch (data[0] % 8) {
      case 0: {
        const JoinRequest j = parse_join(body, "fuzz");
        check(j.wait_s >= 0 && j.wait_s <= 86400);
        break;
      }
      case 1: {
        const GroupReply g = parse_group(body, "fuzz");
        check(g.overlap_choice >= -1 && g.overlap_choice <= 1);
        break;
      }
      case 2: {
        const PartMessage p = parse_part(body, "fuzz");
        check(p.numel >= 0 && p.numel <= kMaxPartElements && std::isfinite(p.weight) && p.weight >= 0 &&
              p.piece >= 0 && p.piece < kMaxPieces);
        // A sparse part's size is not bounded by its bytes: the owner compares it with its slot
        // before decoding (averaging.cpp); here it is bounded as a part of this message could be.
        if (encoding.sparse && p.numel > static_cast<int64_t>(body.size()) * kSparseChunk) break;
        const at::Tensor values = decode_part(p.payload, p.numel, encoding, "fuzz");
        check(values.numel() == p.numel && values.isfinite().all().item<bool>());
        break;
      }
      case 3: {
        try {  // a ring's unit and opening (atom/averaging_ring.cpp)
          const RingMessage r = parse_ring(body, "fuzz");
          check(r.numel >= 0 && r.numel <= kMaxPartElements && std::isfinite(r.weight) && r.weight >= 0 && r.row >= 0 &&
                r.row < kMaxPieces && r.step >= 0 && r.step < 2 * kMaxPieces);
        } catch (const tessera::Error&) {
        }
        try {
          check(parse_ring_open(body, "fuzz").wait_s >= 0);
        } catch (const tessera::Error&) {
        }
        const SumReply s = parse_sum(body, "fuzz");
        check(std::isfinite(s.weight) && s.piece >= 0 && s.piece < kMaxPieces);
        for (const Screening& m : s.screened) check(m.kept >= 0 && m.kept <= 1 && m.member.size() <= 64);
        break;
      }
      case 4: {
        const StateOffer o = parse_offer(body, "fuzz");
        check(!o.ready || (o.swarm_step >= 0 && o.bytes > 0));
        break;
      }
      case 5: {
        try {
          check(parse_round_request(body, "fuzz").swarm_step >= 0);
        } catch (const tessera::Error&) {
        }
        const ChunkRequest c = parse_chunk_request(body, "fuzz");
        check(c.swarm_step >= 0 && c.offset >= 0 && c.length >= 0);
        break;
      }
      case 6: {
        const auto r = PeerRecord::parse(PeerRecord::signed_text(body, "demo", tessera::fuzz::swarm_key()), "demo", tessera::fuzz::swarm_key());
        if (r) check(!r->id.empty() && r->swarm_step >= 0 && std::isfinite(r->time));
        check(!PeerRecord::parse(body, "demo", tessera::fuzz::swarm_key()));  // unsigned bytes never pass
        break;
      }
      default: {
        // A raw payload decoded as a dense part of the length it implies, or as a sparse part of
        // up to 3 chunks (the second byte's high bits give its length).
        const size_t element = codec == Codec::fp32 ? 4 : codec == Codec::bf16 ? 2 : 1;
        const int64_t n = encoding.sparse ? (data[1] / 6) * 3 * kSparseChunk / 42 + 1
                                          : static_cast<int64_t>((body.size() - (codec == Codec::int8 ? std::min<size_t>(4, body.size()) : 0)) / element);
        const at::Tensor values = decode_part(body, n, encoding, "fuzz");
        check(values.numel() == n && values.isfinite().all().item<bool>());
        break;
      }
    }
  } catch (const tessera::Error&) {
  }
  return 0;
}
