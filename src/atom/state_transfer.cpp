// Snapshots served to joiners and the chunked download from several donors (state_transfer.h).
#include "atom/state_transfer.h"

#include "atom/messages.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "core/fs.h"

namespace tessera::atom {
namespace {

constexpr int64_t kMaxChunk = int64_t{16} << 20;

struct Offer {
  PeerRecord donor;
  int64_t swarm_step = 0, bytes = 0;
  std::string checksum;
};

}  // namespace

bool StateSnapshots::wanted(int64_t swarm_step) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return asked_ && (held_.empty() || held_.back().swarm_step < swarm_step);
}

void StateSnapshots::write(int64_t swarm_step, const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  std::filesystem::create_directories(dir_);
  const std::string path = dir_ + "/state_" + std::to_string(swarm_step) + ".safetensors";
  // The atomic commit of core/fs.h (write_file_atomic) for a file written in pieces: the temporary
  // file fsync'ed by write_safetensors, renamed over the name, the directory fsync'ed.
  write_safetensors(path + ".tmp", tensors, {{"swarm_step", std::to_string(swarm_step)}});
  std::filesystem::rename(path + ".tmp", path);
  fsync_directory(dir_);
  Snapshot s{swarm_step, path, file_checksum(path), static_cast<int64_t>(std::filesystem::file_size(path))};
  std::lock_guard<std::mutex> lock(mutex_);
  held_.push_back(s);
  if (held_.size() > 2) {
    std::filesystem::remove(held_.front().path);
    held_.erase(held_.begin());
  }
  asked_ = false;
}

bool StateSnapshots::serve(Channel& channel, const Message& first) {
  if (first.type == kManifest) {
    nlohmann::json reply = {{"ready", false}};
    {
      std::lock_guard<std::mutex> lock(mutex_);
      asked_ = true;
      if (!held_.empty())
        reply = {{"ready", true},
                 {"swarm_step", held_.back().swarm_step},
                 {"bytes", held_.back().bytes},
                 {"checksum", held_.back().checksum}};
    }
    channel.send(kManifestReply, reply.dump(), Deadline::in(10));
    return true;
  }
  if (first.type != kChunk) return false;
  const ChunkRequest request = parse_chunk_request(first.body, channel.address());
  const int64_t offset = request.offset, length = request.length;
  Snapshot s;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const Snapshot& h : held_)
      if (h.swarm_step == request.swarm_step) s = h;
  }
  if (s.swarm_step < 0 || length > kMaxChunk || offset > s.bytes - length)
    throw WireError("peer " + channel.address() + " asked for a chunk this peer does not hold");
  std::string bytes(static_cast<size_t>(length), '\0');
  std::ifstream in(s.path, std::ios::binary);
  in.seekg(offset);
  in.read(bytes.data(), length);
  if (!in) throw WireError("cannot read the snapshot " + s.path);
  channel.send(kChunkReply, bytes, Deadline::in(60));
  return true;
}

namespace {

// Every candidate's offer: its newest snapshot, when it is at least at its current swarm step.
// Candidates that cannot be asked are named in `failures`.
std::vector<Offer> ask_offers(const std::vector<PeerRecord>& candidates, const SwarmKey& key, const std::string& my_id,
                              size_t max_bytes, int64_t max_state_bytes, std::string& failures) {
  std::vector<Offer> offers;
  failures.clear();
  for (const PeerRecord& donor : candidates) {
    try {
      const auto [host, port] = split_address(donor.address, "a donor");
      auto c = Channel::connect(host, port, key, my_id, Deadline::in(5), max_bytes);
      c->send(kManifest, "{}", Deadline::in(5));
      const StateOffer offer = parse_offer(c->receive(Deadline::in(10), kManifestReply).body, donor.address);
      if (!offer.ready) continue;
      if (offer.bytes > max_state_bytes)
        throw WireError("offers a state of " + std::to_string(offer.bytes) + " bytes, more than this peer's own (at most " +
                        std::to_string(max_state_bytes) + ")");
      if (offer.swarm_step >= donor.swarm_step) offers.push_back({donor, offer.swarm_step, offer.bytes, offer.checksum});
    } catch (const std::exception& e) {
      failures += std::string(failures.empty() ? "" : "; ") + donor.id + ": " + e.what();
    }
  }
  return offers;
}

// The offers of the newest state, offered by the most donors (empty without offers).
std::vector<Offer> newest_most_offered(const std::vector<Offer>& offers) {
  std::map<std::pair<int64_t, std::string>, std::vector<Offer>> groups;
  for (const Offer& o : offers) groups[{o.swarm_step, o.checksum}].push_back(o);
  const std::vector<Offer>* best = nullptr;
  for (const auto& [k, g] : groups)
    if (!best || k.first > best->front().swarm_step || (k.first == best->front().swarm_step && g.size() > best->size()))
      best = &g;
  return best ? *best : std::vector<Offer>();
}

// The snapshot `donors` all offer, chunk k from donor k mod D with the donors in parallel; a failed
// donor's chunks go to the others (three attempts). Checked against its checksum.
std::string fetch_chunks(const std::vector<Offer>& donors, const SwarmKey& key, const std::string& my_id,
                         size_t max_bytes, Deadline deadline) {
  const int64_t total = donors.front().bytes, step = donors.front().swarm_step;
  const int64_t chunk = std::clamp<int64_t>(total / (4 * static_cast<int64_t>(donors.size())) + 1, 1 << 16, kMaxChunk);
  std::string bytes(static_cast<size_t>(total), '\0');
  std::vector<int64_t> pending;
  for (int64_t offset = 0; offset < total; offset += chunk) pending.push_back(offset);
  std::vector<std::string> errors(donors.size());
  // One donor's share, one request per connection; what it did not deliver goes back to `failed`.
  auto fetch_share = [&](size_t d, const std::vector<int64_t>& share, std::vector<int64_t>& failed) {
    size_t done = 0;
    try {
      const auto [host, port] = split_address(donors[d].donor.address, "a donor");
      for (; done < share.size(); ++done) {
        const int64_t offset = share[done], length = std::min(chunk, total - offset);
        auto c = Channel::connect(host, port, key, my_id, deadline, max_bytes);
        c->send(kChunk, nlohmann::json{{"swarm_step", step}, {"offset", offset}, {"length", length}}.dump(), deadline);
        const Message m = c->receive(deadline, kChunkReply);
        if (static_cast<int64_t>(m.body.size()) != length)
          throw WireError("donor " + donors[d].donor.address + " sent a chunk of the wrong size");
        std::copy(m.body.begin(), m.body.end(), bytes.begin() + offset);
      }
    } catch (const std::exception& e) {
      errors[d] = donors[d].donor.id + ": " + e.what();
      failed.assign(share.begin() + static_cast<std::ptrdiff_t>(done), share.end());
    }
  };
  for (int attempt = 0; attempt < 3 && !pending.empty(); ++attempt) {
    std::vector<size_t> healthy;
    for (size_t d = 0; d < donors.size(); ++d)
      if (errors[d].empty()) healthy.push_back(d);
    if (healthy.empty()) break;
    std::vector<std::vector<int64_t>> share(donors.size()), failed(donors.size());
    for (size_t k = 0; k < pending.size(); ++k) share[healthy[k % healthy.size()]].push_back(pending[k]);
    std::vector<std::thread> threads;
    for (size_t d = 0; d < donors.size(); ++d) threads.emplace_back(fetch_share, d, std::cref(share[d]), std::ref(failed[d]));
    for (std::thread& t : threads) t.join();
    pending.clear();
    for (const auto& f : failed) pending.insert(pending.end(), f.begin(), f.end());
  }
  std::string donor_errors;
  for (const std::string& e : errors)
    if (!e.empty()) donor_errors += (donor_errors.empty() ? "" : "; ") + e;
  require(pending.empty(), "downloading the swarm's state failed: ", donor_errors);
  require(checksum(bytes) == donors.front().checksum, "the swarm's state downloaded from ", donors.size(),
          " donor(s) does not match its checksum (", donor_errors, ")");
  return bytes;
}

}  // namespace

Download download_state(const std::vector<PeerRecord>& candidates, const SwarmKey& key, const std::string& my_id,
                        const std::string& dir, size_t max_bytes, int64_t max_state_bytes, Deadline deadline) {
  require(!candidates.empty(), "internal: a download needs donors");
  // Donors write a snapshot at their next step once asked, so offers of different steps converge
  // within a round or two: wait that long for every responding donor to offer the same state.
  const Deadline patience = Deadline::in(std::min(5.0, deadline.seconds_left() / 2));
  for (std::string failures;;) {
    const std::vector<Offer> donors = newest_most_offered(ask_offers(candidates, key, my_id, max_bytes, max_state_bytes, failures));
    if (!donors.empty() && (donors.size() == candidates.size() || patience.seconds_left() <= 0)) {
      const std::string bytes = fetch_chunks(donors, key, my_id, max_bytes, deadline);
      std::filesystem::create_directories(dir);
      const int64_t step = donors.front().swarm_step;
      const std::string path = dir + "/downloaded_" + std::to_string(step) + ".safetensors";
      write_file_durable(path, bytes);
      Download out{path, step, {}, donors.front().bytes};
      for (const Offer& o : donors) out.donors.push_back(o.donor.id);
      return out;
    }
    if (deadline.seconds_left() <= 0)
      fail("no live peer offered its state before the deadline", failures.empty() ? "" : " (" + failures + ")");
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

}  // namespace tessera::atom
