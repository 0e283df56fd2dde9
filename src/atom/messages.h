// The messages peers exchange once a channel is open (atom/wire.h frames and authenticates them):
// their layout, the parts' codec, and every parser (senders build headers with pack() where they
// send them). A message from a peer holds the swarm key, but it may still come
// from a buggy or hostile build: every parse_* checks each field (type, range, finiteness, sizes
// against the payload) and throws WireError naming the peer (`from`) otherwise, so a bad message
// ends that exchange and never reaches an allocation or a computation. The fuzz target
// tests/fuzz/fuzz_swarm_messages.cpp drives every parser.
//
// Round messages (atom/averaging.h) are [u32 header length][JSON header][binary payload]:
//   JOIN   {round, address, wait_s, state, state_step}     member -> host
//   GROUP  {token, members: [[id, address], ...], reason, overlap}  host -> member
//   PART   {token, piece, numel, weight, wait_s, rule} + encoded piece      member -> owner
//   SUM    {piece, weight, screened: [[id, kept, outlier], ...]} + encoded piece of the sum
//                                                                          owner -> member
//   RING_OPEN {token, wait_s}                              member -> next member, first on the channel
//   RING   {token, row, step, numel, weight, wait_s} + float32 cell         member -> next member
// (a ring's unit, atom/averaging.h: step < n - 1 a partial sum of `weight`, later a whole one;
// piece: the index of the piece of the part, and numel its entries: a part travels in pieces,
// atom/averaging.h; rule: the sender's swarm.aggregation, which the owner's must equal; screened:
// how each member's contribution fared under a robust rule, absent under mean:
// atom/robust_aggregation.h)
// State messages (atom/state_transfer.h) are JSON:
//   MANIFEST {}  ->  MANIFEST_REPLY {ready, swarm_step, bytes, checksum}
//   CHUNK {swarm_step, offset, length}  ->  the chunk's bytes
// The replay message (atom/round_log.h):
//   ROUND {swarm_step}  ->  the round's averaged gradient as float32 bytes, or nothing
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "atom/robust_aggregation.h"

namespace tessera::atom {

struct RoundMember {
  std::string id, address;
};

enum class Codec : uint8_t { fp32 = 0, bf16 = 1, int8 = 2 };
Codec codec_from_name(const std::string& name);  // "fp32", "bf16", "int8"

// The largest part a round carries (elements), and the most pieces it travels in; a claim past
// either is refused before any size is computed from it.
constexpr int64_t kMaxPartElements = int64_t{1} << 40;
constexpr int64_t kMaxPieces = 1 << 16;

// A part of a vector as it travels: fp32, bf16, or int8 with a float32 scale in front (symmetric,
// per part). decode_part checks the byte count against `n` and refuses non-finite values.
std::string encode_part(const at::Tensor& values, Codec codec);
at::Tensor decode_part(std::string_view bytes, int64_t n, Codec codec, const std::string& from);
// A dense float32 part decoded straight into `out` (a contiguous float32 CPU tensor of its
// length, e.g. the slice of a round's sum it fills): one copy from the received bytes, checked as
// decode_part checks. What `out` held is lost when the part is refused.
void decode_fp32_part_into(std::string_view bytes, const at::Tensor& out, const std::string& from);

// How a round's parts travel (swarm.pseudo_gradient_dtype, swarm.topk_ratio):
//   dense   every entry, encoded as `dtype` (above);
//   sparse  the part is cut into chunks of kSparseChunk entries (the last may be shorter), and
//           each chunk keeps at most ceil(keep x kSparseChunk) of its nonzero entries, those of
//           largest magnitude (keep 1: every nonzero entry, as a round's sums travel). Layout:
//           [u16 count per chunk][u16 index within its chunk per entry kept, ascending within each
//           chunk][the kept values, chunk by chunk, dense as `dtype`]: 2 bytes of index and 1 (int8)
//           to 4 (fp32) of value per entry kept.
// decode_part refuses a count past its chunk, an index out of its chunk or not ascending, and any
// byte count the counts do not imply; entries not sent decode as 0.
constexpr int64_t kSparseChunk = 4096;
struct PartEncoding {
  Codec dtype = Codec::fp32;
  bool sparse = false;
  double keep = 1;  // sparse: the fraction of each chunk's entries kept, in (0, 1]
  bool exact() const { return !sparse && dtype == Codec::fp32; }  // decoding gives back what was encoded
};
std::string encode_part(const at::Tensor& values, const PartEncoding& encoding);
at::Tensor decode_part(std::string_view bytes, int64_t n, const PartEncoding& encoding, const std::string& from);
// How the sum of parts sent as `contributions` travels back: as dense, or sparse keeping every
// nonzero entry (the union of the members' entries).
PartEncoding sum_encoding(const PartEncoding& contributions);

// A JSON integer as int64_t; nullopt for a float (converting one out of range is undefined
// behaviour), an unsigned past int64_t, or another type. Every integer a peer sends is read by it.
std::optional<int64_t> json_int64(const nlohmann::json& v);

// [u32 header length][header][payload].
std::string pack(const nlohmann::json& header, std::string_view payload = {});
// pack()'s beginning, [u32 header length][header], for a payload sent from where it lies
// (Channel::send with a head and a payload).
std::string pack_head(const nlohmann::json& header);
// The bytes encode_part gives `values` as a dense float32 part, read in place where `values` is a
// contiguous float32 host tensor; else from a host copy that `keep` holds for as long as the bytes
// are read.
std::string_view fp32_part_bytes(const at::Tensor& values, at::Tensor& keep);

struct JoinRequest {
  int64_t round = 0;
  std::string address;
  double wait_s = 0;  // within [0, 1 day]
  std::string state;  // the member's state digest (atom/swarm.h), at most 64 characters; empty: unknown
  int64_t state_step = -1;  // the swarm step that state is of (-1 with no state)
};
struct GroupReply {
  std::string token;  // empty: no group with this member (reason says why)
  std::vector<RoundMember> members;
  std::string reason;
  int overlap_choice = -1;  // the host's word on how rounds go: 1, 0 or -1 (Averager::set_overlap_choice)
};
struct PartMessage {
  std::string token;
  int64_t piece = 0;  // within [0, kMaxPieces)
  int64_t numel = 0;  // the piece's entries, within [0, kMaxPartElements]
  double weight = 0;  // finite, >= 0
  double wait_s = 0;
  Aggregation rule = Aggregation::mean;
  std::string_view payload;  // a view into the message body
};
struct RingMessage {
  std::string token;
  int64_t row = 0, step = 0;  // within [0, kMaxPieces) and [0, 2 kMaxPieces)
  int64_t numel = 0;          // within [0, kMaxPartElements]
  double weight = 0;          // finite, >= 0
  double wait_s = 0;
  std::string_view payload;
};
struct SumReply {
  int64_t piece = 0;  // within [0, kMaxPieces)
  double weight = 0;
  std::vector<Screening> screened;  // ids of at most 64 characters, kept within [0, 1]
  std::string_view payload;
};

JoinRequest parse_join(const std::string& body, const std::string& from);
GroupReply parse_group(const std::string& body, const std::string& from);
PartMessage parse_part(const std::string& body, const std::string& from);
SumReply parse_sum(const std::string& body, const std::string& from);
RingMessage parse_ring(const std::string& body, const std::string& from);
struct RingOpen {
  std::string token;
  double wait_s = 0;
};
RingOpen parse_ring_open(const std::string& body, const std::string& from);
// Their payloads view `body`: a temporary body would leave them dangling (the sanitizer build
// caught a test doing so), so one does not compile.
PartMessage parse_part(std::string&& body, const std::string& from) = delete;
SumReply parse_sum(std::string&& body, const std::string& from) = delete;

struct StateOffer {
  bool ready = false;
  int64_t swarm_step = 0, bytes = 0;  // when ready: >= 0 and > 0
  std::string checksum;
};
struct ChunkRequest {
  int64_t swarm_step = 0, offset = 0, length = 0;  // each >= 0
};

StateOffer parse_offer(const std::string& body, const std::string& from);
ChunkRequest parse_chunk_request(const std::string& body, const std::string& from);

struct RoundRequest {
  int64_t swarm_step = 0;  // >= 0
};
RoundRequest parse_round_request(const std::string& body, const std::string& from);

}  // namespace tessera::atom
