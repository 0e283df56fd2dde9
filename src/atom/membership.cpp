// The swarm's DHT over OpenDHT (membership.h). OpenDHT's headers stay in this file.
#include "atom/membership.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <future>
#include <map>
#include <mutex>

#include <opendht.h>

#include "atom/wire.h"
#include "core/error.h"

namespace tessera::atom {
namespace {

constexpr dht::ValueType::Id kRecordType = 0x7e55;  // "tessera peer record"
constexpr double kDhtLifetimeS = 600;                // a value's lifetime in the DHT (not liveness)

// The first 8 bytes of the SHA-1 of `label`, never 0 (an unset value id; the network id, its low 32
// bits, is kept off 0 too: that is OpenDHT's public network).
uint64_t nonzero_hash(const std::string& label) {
  const dht::InfoHash h = dht::InfoHash::get(label);
  uint64_t id = 0;
  for (size_t i = 0; i < sizeof(id); ++i) id = (id << 8) | h[i];
  return id == 0 ? 1 : id;
}

}  // namespace

struct Membership::Impl {
  std::string swarm;
  SwarmKey key;
  double ttl;
  dht::InfoHash where;
  dht::DhtRunner node;
  std::atomic<int64_t> refused{0};
  // Every verified record seen (by a listen on the key and by each get), newest per peer: a get
  // that finds fewer values than are stored (a node still filling its routing table) does not
  // make live peers vanish; a record still leaves by its age.
  std::mutex mutex;
  std::map<std::string, PeerRecord> seen;
  // saw_round's news: by peer, the step a round this peer took part in brought it to, and until
  // when (one record lifetime) a record of an earlier step is older news than that. A member whose
  // last sums came later republishes its old step meanwhile (its publisher runs on a timer), and
  // that record, newer by its time, took the member out of the next round's candidates: on
  // 10 Mbit links one peer in four was left out of every round and fell behind.
  std::map<std::string, std::pair<int64_t, double>> first_hand;

  void remember(const std::vector<std::shared_ptr<dht::Value>>& values) {
    const double now = unix_now();
    for (const auto& v : values) {
      if (!v) continue;
      std::optional<PeerRecord> r = verify(*v);
      if (!r) continue;
      std::lock_guard<std::mutex> lock(mutex);
      const auto news = first_hand.find(r->id);
      if (news != first_hand.end() && r->swarm_step < news->second.first && now < news->second.second) continue;
      auto it = seen.find(r->id);
      if (it == seen.end() || it->second.time < r->time) seen[r->id] = *r;
    }
  }

  Impl(std::string s, const SwarmKey& k, double t)
      : swarm(std::move(s)), key(k), ttl(t), where(dht::InfoHash::get("tessera/swarm/" + swarm + "/peers")) {}

  std::optional<PeerRecord> verify(const dht::Value& v) {
    std::optional<PeerRecord> r =
        PeerRecord::parse(std::string(v.data.begin(), v.data.end()), swarm, key);
    if (!r) ++refused;
    return r;
  }
};

Membership::Membership(const std::string& swarm, const SwarmKey& key, const std::string& host, int port,
                       const std::vector<std::string>& initial_peers, double record_ttl_s)
    : impl_(std::make_unique<Impl>(swarm, key, record_ttl_s)) {
  Impl* impl = impl_.get();
  // Only records that verify are stored, and an edit only by a newer record of the same peer.
  auto store = [impl](dht::InfoHash, const std::shared_ptr<dht::Value>& v, const dht::InfoHash&, const dht::SockAddr&) {
    return v && impl->verify(*v).has_value();
  };
  auto edit = [impl](dht::InfoHash, const std::shared_ptr<dht::Value>& old, std::shared_ptr<dht::Value>& now,
                     const dht::InfoHash&, const dht::SockAddr&) {
    if (!old || !now) return false;
    const auto a = impl->verify(*old), b = impl->verify(*now);
    return a && b && a->id == b->id && b->time >= a->time;
  };
  // Liveness is the reader's: a record older than record_ttl_s is dropped (live_peers). In the DHT a
  // value lives kDhtLifetimeS: with a lifetime of seconds (the ttl) OpenDHT re-announced each
  // record without pause and every node told its listeners of each refresh, ~1300 messages a
  // second per node, which halved four peers' training speed on two cores.
  const auto expiry = std::chrono::duration_cast<dht::duration>(
      std::chrono::duration<double>(std::max(kDhtLifetimeS, record_ttl_s)));
  dht::DhtRunner::Config config;
  config.dht_config.node_config.network = std::max<dht::NetId>(1, static_cast<dht::NetId>(nonzero_hash("tessera swarm network " + swarm)));
  config.dht_config.node_config.max_req_per_sec = -1;
  config.dht_config.node_config.max_peer_req_per_sec = -1;
  config.threaded = true;
  try {
    const std::vector<dht::SockAddr> bind = dht::SockAddr::resolve(host, std::to_string(port));
    require(!bind.empty(), "no address");
    config.bind4 = bind.front();
    impl_->node.run(config, dht::DhtRunner::Context{});
  } catch (const std::exception& e) {
    fail("cannot start the swarm's DHT node on UDP ", host, ":", port, ": ", e.what());
  }
  impl_->node.registerType(dht::ValueType(kRecordType, "tessera peer record", expiry, store, edit));
  impl_->node.listen(impl_->where, [impl](const std::vector<std::shared_ptr<dht::Value>>& values, bool expired) {
    if (!expired) impl->remember(values);
    return true;
  });
  for (const std::string& peer : initial_peers) {
    const auto [peer_host, peer_port] = split_address(peer, "--initial-peer");
    impl_->node.bootstrap(peer_host, std::to_string(peer_port));
  }
}

Membership::~Membership() {
  impl_->node.shutdown({}, true);
  impl_->node.join();
}

void Membership::publish(const PeerRecord& record) {
  const std::string bytes = record.encode(impl_->swarm, impl_->key);
  auto v = std::make_shared<dht::Value>(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  v->type = kRecordType;
  v->id = nonzero_hash("tessera peer value " + record.id);
  impl_->node.put(impl_->where, v, [](bool) {}, dht::time_point::max(), /*permanent=*/false);
}

void Membership::publish_raw(const std::string& bytes, uint64_t value_id) {
  auto v = std::make_shared<dht::Value>(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  v->type = kRecordType;
  v->id = value_id;
  impl_->node.put(impl_->where, v, [](bool) {}, dht::time_point::max(), false);
}

std::vector<PeerRecord> Membership::live_peers(double wait_s) {
  auto done = std::make_shared<std::promise<void>>();
  Impl* impl = impl_.get();
  impl_->node.get(
      impl_->where,
      [impl](const std::vector<std::shared_ptr<dht::Value>>& values) {
        impl->remember(values);
        return true;
      },
      [done](bool) { done->set_value(); });
  done->get_future().wait_for(std::chrono::duration<double>(wait_s));
  const double now = unix_now();
  std::vector<PeerRecord> out;
  std::lock_guard<std::mutex> lock(impl_->mutex);
  for (const auto& [id, r] : impl_->seen)
    if (now - r.time <= impl_->ttl) out.push_back(r);
  return out;
}

void Membership::saw_round(const std::vector<std::string>& ids, int64_t swarm_step) {
  const double now = unix_now();
  std::lock_guard<std::mutex> lock(impl_->mutex);
  for (const std::string& id : ids) {
    const auto it = impl_->seen.find(id);
    if (it == impl_->seen.end() || it->second.swarm_step >= swarm_step || it->second.time >= now) continue;
    impl_->first_hand[id] = {swarm_step, now + impl_->ttl};
    it->second.swarm_step = swarm_step;
    it->second.samples = 0;
    it->second.state.clear();  // its digest at the new step comes with its own record
    it->second.time = now;
  }
}

int Membership::port() const { return impl_->node.getBoundPort(AF_INET); }

int64_t Membership::refused_records() const { return impl_->refused; }

}  // namespace tessera::atom
