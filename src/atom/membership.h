// Membership: the swarm's DHT (OpenDHT, a Kademlia DHT) through which peers find each other and
// see each other's progress. No node is special: a new peer bootstraps from any live one, and the
// first peer started can leave like any other.
//
// Each peer runs one DHT node on UDP at its --listen address (the same port as its TCP channels),
// on a DHT network of its own (the network id is derived from the swarm's name, so nodes of other
// swarms and the public OpenDHT network do not mix with it). Its record (atom/peer_record.h) lives
// under the key "tessera/swarm/<name>/peers" with a value id fixed per peer, so republishing
// replaces it. The value type's store and edit policies, run by every peer's node, admit only
// records whose tag verifies under the swarm key (and an edit only by a newer record of the same
// peer): a forged record is never stored by an honest node, and one that reaches a reader anyway is
// dropped by parse(). Readers drop a record whose time is older than swarm.record_ttl_s, so a dead
// peer vanishes within that time; in the DHT itself a value lives 10 minutes (a lifetime of
// seconds made OpenDHT re-announce it without pause: membership.cpp).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "atom/peer_record.h"
#include "atom/swarm_key.h"

namespace tessera::atom {

class Membership {
 public:
  // Starts the node on host:port (UDP) and bootstraps from `initial_peers` (HOST:PORT each; none
  // for the first peer of a swarm).
  Membership(const std::string& swarm, const SwarmKey& key, const std::string& host, int port,
             const std::vector<std::string>& initial_peers, double record_ttl_s);
  ~Membership();

  // Publishes (or replaces) this peer's record; returns at once.
  void publish(const PeerRecord& record);
  // The live peers' records (tags verified, not older than the ttl, newest per id): every record
  // this node has seen, kept current by a listen on the swarm's key, after a fresh get of at most
  // `wait_s` seconds.
  std::vector<PeerRecord> live_peers(double wait_s = 2.0);
  // First-hand news from a round this peer took part in: the peers `ids` completed it and are now
  // at `swarm_step` with nothing accumulated. Their cached records say so at once (the records
  // they publish next can reach this node seconds late when bulk traffic fills the link, and a
  // stale view splits the next round's candidates); a newer record from the DHT replaces it, unless
  // it tells of an earlier step within a record lifetime (the member republished before its own
  // round ended).
  void saw_round(const std::vector<std::string>& ids, int64_t swarm_step);
  // Publishes raw bytes under the swarm's key, as a stranger's node would (tests of forged records).
  void publish_raw(const std::string& bytes, uint64_t value_id);
  // The UDP port the node is bound to (the one asked for, or the one chosen for port 0).
  int port() const;
  // Records seen that failed verification (forged, altered, another key).
  int64_t refused_records() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera::atom
