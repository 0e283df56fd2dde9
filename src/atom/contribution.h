// ContributionProgress: a round's contribution that is still being computed when the round starts.
//
// In batch mode a peer starts the round its next local step will close before that step's
// backward (atom/swarm.h, "overlapped rounds"): the round forms its group while the step runs, and
// each piece of the contribution goes out as soon as the gradients under it are final, as data
// parallelism's buckets do. The producer (the swarm, from each parameter's post-accumulate hook)
// marks ranges of the contribution vector final in any order; the round (atom/averaging.h) sends a
// piece once its whole range is final, and fails at once when the producer withdraws the
// contribution (a gradient that is not finite, a step that ended otherwise, the peer leaving).
//
// Invariant: a range marked final is never written again by the producer, so the round may read it
// from another thread while the producer writes the ranges not yet final.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>

namespace tessera::atom {

class ContributionProgress {
 public:
  explicit ContributionProgress(int64_t numel) : numel_(numel) {}

  // Producer side. Each call runs the listener afterwards (outside this object's lock).
  void mark_final(int64_t begin, int64_t end);
  void mark_all_final() { mark_final(0, numel_); }
  void withdraw(const std::string& why);

  // Round side, any thread.
  int64_t numel() const { return numel_; }
  bool final(int64_t begin, int64_t end) const;
  bool all_final() const { return final(0, numel_); }
  // Empty unless withdrawn: why.
  std::string withdrawn() const;
  // Called after every change (the averager wakes its waits with it); set before the round starts.
  void on_change(std::function<void()> listener);

 private:
  void changed();

  const int64_t numel_;
  mutable std::mutex mutex_;
  std::map<int64_t, int64_t> final_;  // disjoint, non-adjacent [begin, end) ranges by begin
  std::string withdrawn_;
  std::function<void()> listener_;
};

}  // namespace tessera::atom
