// State transfer between peers: a late joiner (or a peer that fell behind) downloads the swarm's
// state instead of initialising its own, in chunks from several donors at once, so that joiners do
// not choke one donor.
//
// A donor's state is a snapshot file (safetensors: the model under its Hugging Face names as
// "model.<name>", the optimizer's training state, the swarm's own tensors, and its swarm step in
// the metadata), written between two of its steps when someone asked for it, so it is never torn
// by a running update. Under batch mode every peer at one swarm step holds the same state; under
// DiLoCo the snapshot is written just after an outer step and holds what the peers share (the
// parameters, the outer tensors: no inner optimizer state, which is each peer's own). Either way
// their snapshots are the same bytes (the writer's order is fixed): a joiner asks every live peer
// ahead of it for its manifest (swarm step, size, checksum) until all offer the same state (at
// most 5 s: asked donors write a snapshot at their next step, so their offers converge), else takes
// the newest state that most donors offer, and fetches chunk k from donor k mod D, several at once. The file is then read by
// the checked safetensors reader: a donor sending garbage fails the download (named), it never
// corrupts the joiner.
//
// Messages (over TLS 1.3 channels, atom/wire.h; their layout and checked parsing are
// atom/messages.h's): MANIFEST -> an offer, CHUNK -> the bytes.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "atom/peer_record.h"
#include "atom/wire.h"

namespace tessera::atom {

enum StateMessage : uint8_t { kManifest = 20, kManifestReply = 21, kChunk = 22, kChunkReply = 23 };

// A donor's snapshots: the newest two (a download of the older one may still be running).
class StateSnapshots {
 public:
  explicit StateSnapshots(std::string dir) : dir_(std::move(dir)) {}
  // Whether a joiner asked for a newer snapshot than the one held (at `swarm_step`).
  bool wanted(int64_t swarm_step) const;
  // Writes the snapshot of `swarm_step` (the caller's state between two steps).
  void write(int64_t swarm_step, const std::vector<std::pair<std::string, at::Tensor>>& tensors);
  // Answers a MANIFEST or CHUNK request; false for other messages.
  bool serve(Channel& channel, const Message& first);

 private:
  struct Snapshot {
    int64_t swarm_step = -1;
    std::string path, checksum;
    int64_t bytes = 0;
  };
  std::string dir_;
  mutable std::mutex mutex_;
  std::vector<Snapshot> held_;  // oldest first, at most two
  bool asked_ = false;
};

struct Download {
  std::string path;        // the snapshot file, checked by its checksum
  int64_t swarm_step = 0;
  std::vector<std::string> donors;  // ids of the peers it came from
  int64_t bytes = 0;
};

// Downloads the newest snapshot most of `candidates` (live peers ahead of this one) offer into
// `dir`, spreading its chunks over every donor offering it. Waits up to `deadline` for donors to
// write their snapshot. A donor offering more than `max_state_bytes` (the size this peer's own
// state allows) is refused before anything is allocated. Throws naming the donors on failure.
Download download_state(const std::vector<PeerRecord>& candidates, const SwarmKey& key, const std::string& my_id,
                        const std::string& dir, size_t max_bytes, int64_t max_state_bytes, Deadline deadline);

}  // namespace tessera::atom
