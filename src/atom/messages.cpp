// The swarm's messages: encoding and checked parsing (messages.h).
#include "atom/messages.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include <ATen/ATen.h>

#include "atom/wire.h"
#include "core/error.h"
#include "core/flat_tensors.h"

namespace tessera::atom {
namespace {

// The header, and the payload as a view into `body` (a part can be hundreds of MB: not copied).
std::pair<nlohmann::json, std::string_view> unpack(const std::string& body, const std::string& from) {
  uint32_t n = 0;
  if (body.size() < 4) throw WireError("peer " + from + " sent a malformed round message");
  std::memcpy(&n, body.data(), 4);
  if (n > body.size() - 4 || n > 65536) throw WireError("peer " + from + " sent a malformed round message");
  nlohmann::json header = nlohmann::json::parse(body.begin() + 4, body.begin() + 4 + n, nullptr, false);
  if (!header.is_object()) throw WireError("peer " + from + " sent a malformed round message");
  return {std::move(header), std::string_view(body).substr(4 + n)};
}

nlohmann::json parse_json(const std::string& body, const std::string& from) {
  nlohmann::json j = nlohmann::json::parse(body, nullptr, false);
  if (!j.is_object()) throw WireError("peer " + from + " sent a malformed state message");
  return j;
}

template <class T>
T field(const nlohmann::json& j, const char* key, const std::string& from) {
  try {
    if constexpr (std::is_same_v<T, int64_t>) {
      const std::optional<int64_t> v = json_int64(j.at(key));
      if (!v) throw WireError("peer " + from + " sent a message without a valid '" + key + "'");
      return static_cast<T>(*v);
    } else {
      return j.at(key).get<T>();
    }
  } catch (const nlohmann::json::exception&) {
    throw WireError("peer " + from + " sent a message without a valid '" + key + "'");
  }
}

// An integer field within [lo, hi].
int64_t bounded(const nlohmann::json& j, const char* key, int64_t lo, int64_t hi, const std::string& from) {
  const std::optional<int64_t> v = j.contains(key) ? json_int64(j.at(key)) : std::nullopt;
  if (!v) throw WireError("peer " + from + " sent a message without a valid '" + key + "'");
  if (*v < lo || *v > hi)
    throw WireError("peer " + from + " sent '" + key + "' = " + std::to_string(*v) + ", outside [" +
                    std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return *v;
}

// A finite number field within [lo, hi].
double finite(const nlohmann::json& j, const char* key, double lo, double hi, const std::string& from) {
  const double x = field<double>(j, key, from);
  if (!std::isfinite(x) || x < lo || x > hi)
    throw WireError("peer " + from + " sent '" + key + "' = " + std::to_string(x) + ", not a number in [" +
                    std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return x;
}

constexpr double kMaxWaitS = 86400;

}  // namespace

std::optional<int64_t> json_int64(const nlohmann::json& v) {
  if (!v.is_number_integer()) return std::nullopt;
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) return std::nullopt;
  return v.get<int64_t>();
}

Codec codec_from_name(const std::string& name) {
  if (name == "fp32") return Codec::fp32;
  if (name == "bf16") return Codec::bf16;
  if (name == "int8") return Codec::int8;
  fail("swarm.pseudo_gradient_dtype must be fp32, bf16 or int8 (got '", name, "')");
}

std::string encode_part(const at::Tensor& values, Codec codec) {
  if (codec == Codec::fp32) {
    at::Tensor keep;
    return std::string(fp32_part_bytes(values, keep));
  }
  const at::Tensor v = values.to(at::kCPU, at::kFloat).contiguous();  // bytes are read from host memory
  at::Tensor out;
  std::string prefix;
  switch (codec) {
    case Codec::fp32: break;  // above
    case Codec::bf16: out = v.to(at::kBFloat16); break;
    case Codec::int8: {
      const float scale = v.numel() ? v.abs().max().item<float>() / 127.0f : 0.0f;
      prefix.assign(reinterpret_cast<const char*>(&scale), sizeof(scale));
      out = scale > 0 ? (v / scale).round().clamp(-127, 127).to(at::kChar) : at::zeros({v.numel()}, at::kChar);
      break;
    }
  }
  out = out.contiguous();
  return prefix + std::string(static_cast<const char*>(out.data_ptr()), out.numel() * out.element_size());
}

at::Tensor decode_part(std::string_view bytes, int64_t n, Codec codec, const std::string& from) {
  const size_t element = codec == Codec::fp32 ? 4 : codec == Codec::bf16 ? 2 : 1;
  const size_t prefix = codec == Codec::int8 ? sizeof(float) : 0;
  if (n < 0 || n > kMaxPartElements)
    throw WireError("peer " + from + " sent a part of " + std::to_string(n) + " elements");
  if (bytes.size() != prefix + static_cast<size_t>(n) * element)
    throw WireError("peer " + from + " sent a part of " + std::to_string(bytes.size()) + " bytes where " +
                    std::to_string(prefix + static_cast<size_t>(n) * element) + " were expected");
  if (codec == Codec::fp32) {
    at::Tensor out = at::empty({n}, at::kFloat);
    decode_fp32_part_into(bytes, out, from);
    return out;
  }
  const at::ScalarType type = codec == Codec::bf16 ? at::kBFloat16 : at::kChar;
  at::Tensor raw = at::empty({n}, type);
  if (n > 0) std::memcpy(raw.data_ptr(), bytes.data() + prefix, static_cast<size_t>(n) * element);  // empty: no buffer
  at::Tensor out = raw.to(at::kFloat);
  if (codec == Codec::int8) {
    float scale = 0;
    std::memcpy(&scale, bytes.data(), sizeof(scale));
    if (!std::isfinite(scale)) throw WireError("peer " + from + " sent a part with a non-finite scale");
    out.mul_(scale);
  }
  if (!all_finite(out)) throw WireError("peer " + from + " sent non-finite values");
  return out;
}

void decode_fp32_part_into(std::string_view bytes, const at::Tensor& out, const std::string& from) {
  require(out.device().is_cpu() && out.scalar_type() == at::kFloat && out.is_contiguous(),
          "decode_fp32_part_into: the destination is not a contiguous float32 CPU tensor");
  if (bytes.size() != static_cast<size_t>(out.nbytes()))
    throw WireError("peer " + from + " sent a part of " + std::to_string(bytes.size()) + " bytes where " +
                    std::to_string(out.nbytes()) + " were expected");
  if (!bytes.empty()) std::memcpy(out.data_ptr(), bytes.data(), bytes.size());  // empty: no buffer
  if (!all_finite(out)) throw WireError("peer " + from + " sent non-finite values");
}

namespace {

// Entries of chunk `c` of a part of `n`.
int64_t chunk_length(int64_t n, int64_t c) { return std::min(kSparseChunk, n - c * kSparseChunk); }

std::string sparse_encode(const at::Tensor& values, Codec dtype, double keep) {
  const at::Tensor v = values.to(at::kCPU, at::kFloat).contiguous().view({-1});
  const int64_t n = v.numel(), chunks = (n + kSparseChunk - 1) / kSparseChunk;
  // Every chunk padded to kSparseChunk with zeros (never kept): [chunks, kSparseChunk].
  const at::Tensor rows = at::constant_pad_nd(v, {0, chunks * kSparseChunk - n}).view({chunks, kSparseChunk});
  const int64_t k = std::min<int64_t>(kSparseChunk, static_cast<int64_t>(std::ceil(keep * kSparseChunk)));
  at::Tensor index;
  if (k == kSparseChunk) {
    index = at::arange(kSparseChunk, at::kLong).expand({chunks, kSparseChunk});
  } else {
    index = std::get<1>(rows.abs().topk(k, 1));
    index = std::get<0>(index.sort(1));
  }
  const at::Tensor kept = rows.gather(1, index);
  const at::Tensor nonzero = kept.ne(0);
  const at::Tensor counts = nonzero.sum(1).to(at::kShort).contiguous();
  const at::Tensor indices = index.masked_select(nonzero).to(at::kShort).contiguous();
  const std::string kept_values = encode_part(kept.masked_select(nonzero), dtype);
  std::string out(static_cast<size_t>(2 * (chunks + indices.numel())), '\0');
  if (chunks > 0) std::memcpy(out.data(), counts.data_ptr(), static_cast<size_t>(2 * chunks));
  if (indices.numel() > 0)
    std::memcpy(out.data() + 2 * chunks, indices.data_ptr(), static_cast<size_t>(2 * indices.numel()));
  return out + kept_values;
}

at::Tensor sparse_decode(std::string_view bytes, int64_t n, Codec dtype, const std::string& from) {
  if (n < 0 || n > kMaxPartElements)
    throw WireError("peer " + from + " sent a part of " + std::to_string(n) + " elements");
  const int64_t chunks = (n + kSparseChunk - 1) / kSparseChunk;
  if (bytes.size() < static_cast<size_t>(2 * chunks))
    throw WireError("peer " + from + " sent a sparse part of " + std::to_string(bytes.size()) + " bytes, too few for the " +
                    std::to_string(chunks) + " chunk counts of " + std::to_string(n) + " elements");
  std::vector<uint16_t> counts(static_cast<size_t>(chunks));
  if (chunks > 0) std::memcpy(counts.data(), bytes.data(), static_cast<size_t>(2 * chunks));
  int64_t total = 0;
  for (int64_t c = 0; c < chunks; ++c) {
    if (counts[static_cast<size_t>(c)] > chunk_length(n, c))
      throw WireError("peer " + from + " sent a sparse part whose chunk " + std::to_string(c) + " keeps " +
                      std::to_string(counts[static_cast<size_t>(c)]) + " of its " + std::to_string(chunk_length(n, c)) +
                      " entries");
    total += counts[static_cast<size_t>(c)];
  }
  const size_t values_at = static_cast<size_t>(2 * (chunks + total));
  if (bytes.size() < values_at)
    throw WireError("peer " + from + " sent a sparse part of " + std::to_string(bytes.size()) +
                    " bytes, too few for its " + std::to_string(total) + " indices");
  std::vector<uint16_t> local(static_cast<size_t>(total));
  if (total > 0) std::memcpy(local.data(), bytes.data() + 2 * chunks, static_cast<size_t>(2 * total));
  std::vector<int64_t> position(static_cast<size_t>(total));
  for (int64_t c = 0, i = 0; c < chunks; ++c)
    for (int64_t j = 0; j < counts[static_cast<size_t>(c)]; ++j, ++i) {
      const int64_t at = local[static_cast<size_t>(i)];
      if (at >= chunk_length(n, c) || (j > 0 && at <= local[static_cast<size_t>(i - 1)]))
        throw WireError("peer " + from + " sent a sparse part whose chunk " + std::to_string(c) + " has index " +
                        std::to_string(at) + " out of place");
      position[static_cast<size_t>(i)] = c * kSparseChunk + at;
    }
  const at::Tensor values = decode_part(bytes.substr(values_at), total, dtype, from);
  at::Tensor out = at::zeros({n}, at::kFloat);
  if (total > 0) out.index_put_({at::tensor(position, at::kLong)}, values);
  return out;
}

}  // namespace

std::string encode_part(const at::Tensor& values, const PartEncoding& encoding) {
  return encoding.sparse ? sparse_encode(values, encoding.dtype, encoding.keep) : encode_part(values, encoding.dtype);
}

at::Tensor decode_part(std::string_view bytes, int64_t n, const PartEncoding& encoding, const std::string& from) {
  return encoding.sparse ? sparse_decode(bytes, n, encoding.dtype, from) : decode_part(bytes, n, encoding.dtype, from);
}

PartEncoding sum_encoding(const PartEncoding& contributions) {
  return {contributions.dtype, contributions.sparse, 1.0};
}

std::string pack_head(const nlohmann::json& header) {
  const std::string h = header.dump();
  std::string out(4, '\0');
  const uint32_t n = static_cast<uint32_t>(h.size());
  std::memcpy(out.data(), &n, 4);
  out += h;
  return out;
}

std::string pack(const nlohmann::json& header, std::string_view payload) { return pack_head(header).append(payload); }

std::string_view fp32_part_bytes(const at::Tensor& values, at::Tensor& keep) {
  keep = values.to(at::kCPU, at::kFloat).contiguous();  // the same tensor where it already is one
  return {static_cast<const char*>(keep.data_ptr()), static_cast<size_t>(keep.nbytes())};
}

JoinRequest parse_join(const std::string& body, const std::string& from) {
  const auto [header, payload] = unpack(body, from);
  JoinRequest j{field<int64_t>(header, "round", from), field<std::string>(header, "address", from),
                finite(header, "wait_s", 0, kMaxWaitS, from), {}};
  if (header.contains("state")) j.state = field<std::string>(header, "state", from);
  if (header.contains("state_step")) j.state_step = bounded(header, "state_step", -1, int64_t{1} << 62, from);
  if (j.state.size() > 64) throw WireError("peer " + from + " sent a state digest of " + std::to_string(j.state.size()) +
                                           " characters (at most 64)");
  return j;
}

GroupReply parse_group(const std::string& body, const std::string& from) {
  const auto [header, payload] = unpack(body, from);
  GroupReply g{field<std::string>(header, "token", from), {}, field<std::string>(header, "reason", from),
               static_cast<int>(bounded(header, "overlap", -1, 1, from))};
  const nlohmann::json members = field<nlohmann::json>(header, "members", from);
  if (!members.is_array()) throw WireError("peer " + from + " sent a group whose members are not a list");
  for (const nlohmann::json& m : members) {
    if (!m.is_array() || m.size() != 2 || !m[0].is_string() || !m[1].is_string())
      throw WireError("peer " + from + " sent a group member that is not [id, address]");
    g.members.push_back({m[0].get<std::string>(), m[1].get<std::string>()});
  }
  return g;
}

PartMessage parse_part(const std::string& body, const std::string& from) {
  const auto [header, payload] = unpack(body, from);
  PartMessage part{field<std::string>(header, "token", from), bounded(header, "piece", 0, kMaxPieces - 1, from),
                   bounded(header, "numel", 0, kMaxPartElements, from), finite(header, "weight", 0, 1e300, from), finite(header, "wait_s", 0, kMaxWaitS, from),
                   Aggregation::mean, payload};
  const std::string rule = field<std::string>(header, "rule", from);
  try {
    part.rule = aggregation_from_name(rule);
  } catch (const Error&) {
    throw WireError("peer " + from + " sent a part under an unknown aggregation rule");
  }
  return part;
}

RingMessage parse_ring(const std::string& body, const std::string& from) {
  const auto [header, payload] = unpack(body, from);
  return {field<std::string>(header, "token", from),          bounded(header, "row", 0, kMaxPieces - 1, from),
          bounded(header, "step", 0, 2 * kMaxPieces - 1, from), bounded(header, "numel", 0, kMaxPartElements, from),
          finite(header, "weight", 0, 1e300, from),            finite(header, "wait_s", 0, kMaxWaitS, from),
          payload};
}

RingOpen parse_ring_open(const std::string& body, const std::string& from) {
  const auto [header, payload] = unpack(body, from);
  return {field<std::string>(header, "token", from), finite(header, "wait_s", 0, kMaxWaitS, from)};
}

SumReply parse_sum(const std::string& body, const std::string& from) {
  const auto [header, payload] = unpack(body, from);
  SumReply reply{bounded(header, "piece", 0, kMaxPieces - 1, from), finite(header, "weight", 0, 1e300, from), {},
                 payload};
  if (!header.contains("screened")) return reply;
  const nlohmann::json& screened = header.at("screened");
  if (!screened.is_array()) throw WireError("peer " + from + " sent a sum whose screening is not a list");
  for (const nlohmann::json& s : screened) {
    if (!s.is_array() || s.size() != 3 || !s[0].is_string() || s[0].get<std::string>().size() > 64 ||
        !s[1].is_number() || !s[2].is_boolean())
      throw WireError("peer " + from + " sent a screening that is not [member, kept, outlier]");
    const double kept = s[1].get<double>();
    if (!std::isfinite(kept) || kept < 0 || kept > 1)
      throw WireError("peer " + from + " sent a screening whose kept share is outside [0, 1]");
    reply.screened.push_back({s[0].get<std::string>(), kept, s[2].get<bool>()});
  }
  return reply;
}

StateOffer parse_offer(const std::string& body, const std::string& from) {
  const nlohmann::json j = parse_json(body, from);
  StateOffer o;
  o.ready = j.contains("ready") && j.at("ready").is_boolean() && j.at("ready").get<bool>();
  if (!o.ready) return o;
  o.swarm_step = bounded(j, "swarm_step", 0, std::numeric_limits<int64_t>::max(), from);
  o.bytes = bounded(j, "bytes", 1, std::numeric_limits<int64_t>::max(), from);
  o.checksum = field<std::string>(j, "checksum", from);
  return o;
}

ChunkRequest parse_chunk_request(const std::string& body, const std::string& from) {
  const nlohmann::json j = parse_json(body, from);
  constexpr int64_t most = std::numeric_limits<int64_t>::max();
  return {bounded(j, "swarm_step", 0, most, from), bounded(j, "offset", 0, most, from),
          bounded(j, "length", 0, most, from)};
}

RoundRequest parse_round_request(const std::string& body, const std::string& from) {
  const nlohmann::json j = parse_json(body, from);
  return {bounded(j, "swarm_step", 0, std::numeric_limits<int64_t>::max(), from)};
}

}  // namespace tessera::atom
