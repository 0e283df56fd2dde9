// PeerRecord: what a peer publishes about itself in the swarm's DHT (atom/membership.h), and its
// wire form.
//
// A record is JSON text followed by a newline and the hex HMAC-SHA256 tag of
// "tessera peer record" | swarm name | the JSON, under the swarm key: a record without a valid tag
// (forged, altered, from another swarm or another key) is refused by parse() and never stored by a
// peer's DHT node. At most kMaxRecordBytes; every field is checked for type and range.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "atom/swarm_key.h"

namespace tessera::atom {

constexpr size_t kMaxRecordBytes = 4096;
constexpr size_t kMaxSuspects = 8;

struct PeerRecord {
  std::string id;       // the peer's identity (atom/swarm.h): 32 hex digits
  std::string address;  // HOST:PORT its channels (TCP) and DHT node (UDP) listen on
  int64_t swarm_step = 0;   // averaging rounds this peer's parameters have taken
  int64_t local_step = 0;   // local steps it has run since it started training
  int64_t samples = 0;      // samples accumulated since its last average (batch) or in this outer step
  int64_t claimed = 0;      // samples of the local step now running (counted toward the target early)
  double loss = 0;          // its last local step's loss
  double samples_per_s = 0;
  double time = 0;          // Unix seconds when published
  bool serving_state = false;  // holds a complete state that joiners may download
  // The digest of its state at swarm_step (atom/swarm.h: batch, its master parameters; DiLoCo, its
  // outer parameters), 16 hex digits; empty while unknown (not yet computed after a round, or a
  // peer that holds no state of the swarm yet).
  std::string state;
  // Members that were outliers of most of this peer's recent rounds under a robust
  // swarm.aggregation (atom/swarm.h): at most kMaxSuspects ids of at most 64 characters.
  std::vector<std::string> suspects;

  // JSON and tag as published.
  std::string encode(const std::string& swarm, const SwarmKey& key) const;
  // Any JSON text with its tag, as encode() lays it out (the fuzz target signs its inputs with it
  // so they reach the field checks behind the tag).
  static std::string signed_text(const std::string& json, const std::string& swarm, const SwarmKey& key);
  // nullopt for anything that is not a well-formed record of this swarm under this key.
  static std::optional<PeerRecord> parse(const std::string& bytes, const std::string& swarm, const SwarmKey& key);
};

double unix_now();

}  // namespace tessera::atom
