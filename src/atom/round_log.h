// RoundLog: the averaged gradients of a batch-mode peer's last rounds, kept so that a peer that fell
// behind (a late joiner after its state download, a restarted peer, a member that missed a round's
// result) catches up by replaying them as updates instead of downloading the whole state again.
//
// Why. A state download lands at least one round old: donors write their snapshot at the step
// after they were asked and go on training while it travels, so in a swarm whose rounds are faster
// than a download a joiner chased a newer step forever (docs/atom.md). A round's averaged
// gradient is one vector of the model's size (the state is three or more), ready in memory, and
// its update is one optimizer step without a forward or backward: a peer replays rounds faster
// than the swarm takes them.
//
// Exactness. In batch mode every member of a round applies the same vector (the mean scattered
// into its final gradients before the update) to the same state at the same step, so a peer that
// holds the state of swarm step s and applies the logged vectors of rounds s, s+1, ... with the
// same clipping and learning rate holds, after each, the state the members hold: bit for bit on
// the same build and hardware.
//
// The log keeps the newest rounds within `max_bytes` (swarm.replay_mb); a vector larger than that
// is not kept, and a gap empties the log (replays must be contiguous). A peer asks for round s
// with ROUND {swarm_step: s} (atom/messages.h) and gets the vector's float32 bytes, or an empty
// reply when the round is not held (the asker then downloads the state).
#pragma once

#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <utility>

#include <ATen/core/Tensor.h>

#include "atom/wire.h"

namespace tessera::atom {

enum ReplayMessage : uint8_t { kRound = 24, kRoundReply = 25 };

class RoundLog {
 public:
  explicit RoundLog(int64_t max_bytes) : max_bytes_(max_bytes) {}
  // Keeps `mean` ([N] float32; the caller writes it no more: it is held, not copied, so a round
  // costs no copy of the model's size) as the update of the round at `swarm_step` (the one that
  // took the swarm from swarm_step to swarm_step + 1).
  void add(int64_t swarm_step, const at::Tensor& mean);
  // Answers a ROUND request; false for other messages.
  bool serve(Channel& channel, const Message& first);
  int64_t rounds() const;

 private:
  int64_t max_bytes_;
  mutable std::mutex mutex_;  // the listener's threads serve while the training thread adds
  std::deque<std::pair<int64_t, at::Tensor>> rounds_;  // oldest first, consecutive steps
  int64_t bytes_ = 0;
};

// Asks the peer at `address` for its round at `swarm_step`: the averaged gradient ([numel] float32),
// or an undefined tensor when it does not hold it. Throws WireError naming the peer when the
// exchange fails or the reply is neither empty nor numel values, or holds one not finite.
at::Tensor fetch_round(const std::string& address, const SwarmKey& key, const std::string& my_id, int64_t swarm_step,
                       int64_t numel, size_t max_bytes, Deadline deadline);

}  // namespace tessera::atom
