// Peer records: encoding, tags and checked parsing (peer_record.h).
#include "atom/peer_record.h"

#include <chrono>
#include <cmath>

#include <nlohmann/json.hpp>

#include "atom/messages.h"

namespace tessera::atom {
namespace {

std::string record_tag(const std::string& swarm, const std::string& json, const SwarmKey& key) {
  const Tag t = key.tag({"tessera peer record", swarm, "\n", json});
  return to_hex(std::string_view(reinterpret_cast<const char*>(t.data()), t.size()));
}

}  // namespace

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string PeerRecord::encode(const std::string& swarm, const SwarmKey& key) const {
  const nlohmann::json j = {{"id", id},           {"address", address}, {"swarm_step", swarm_step},
                            {"local_step", local_step}, {"samples", samples}, {"claimed", claimed},
                            {"loss", loss},       {"samples_per_s", samples_per_s}, {"time", time},
                            {"serving_state", serving_state}, {"suspects", suspects}, {"state", state}};
  return signed_text(j.dump(), swarm, key);
}

std::string PeerRecord::signed_text(const std::string& json, const std::string& swarm, const SwarmKey& key) {
  return json + "\n" + record_tag(swarm, json, key);
}

std::optional<PeerRecord> PeerRecord::parse(const std::string& bytes, const std::string& swarm, const SwarmKey& key) {
  if (bytes.size() > kMaxRecordBytes) return std::nullopt;
  const size_t newline = bytes.rfind('\n');
  if (newline == std::string::npos) return std::nullopt;
  const std::string json = bytes.substr(0, newline), tag = bytes.substr(newline + 1);
  if (!same_bytes(tag, record_tag(swarm, json, key))) return std::nullopt;
  const nlohmann::json j = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return std::nullopt;
  PeerRecord r;
  try {
    r.id = j.at("id").get<std::string>();
    r.address = j.at("address").get<std::string>();
    r.loss = j.at("loss").get<double>();
    r.samples_per_s = j.at("samples_per_s").get<double>();
    r.time = j.at("time").get<double>();
    r.serving_state = j.at("serving_state").get<bool>();
    if (j.contains("suspects")) r.suspects = j.at("suspects").get<std::vector<std::string>>();
    if (j.contains("state")) r.state = j.at("state").get<std::string>();
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
  auto integer = [&](const char* key) { return j.contains(key) ? json_int64(j.at(key)) : std::nullopt; };
  const std::optional<int64_t> swarm_step = integer("swarm_step"), local_step = integer("local_step"),
                               samples = integer("samples"), claimed = integer("claimed");
  if (!swarm_step || !local_step || !samples || !claimed) return std::nullopt;
  r.swarm_step = *swarm_step;
  r.local_step = *local_step;
  r.samples = *samples;
  r.claimed = *claimed;
  if (r.id.empty() || r.id.size() > 64 || r.address.empty() || r.address.size() > 256 || r.swarm_step < 0 ||
      r.local_step < 0 || r.samples < 0 || r.claimed < 0 || !std::isfinite(r.time) || !std::isfinite(r.samples_per_s) ||
      r.suspects.size() > kMaxSuspects || r.state.size() > 64)
    return std::nullopt;
  for (const std::string& s : r.suspects)
    if (s.empty() || s.size() > 64) return std::nullopt;
  return r;
}

}  // namespace tessera::atom
