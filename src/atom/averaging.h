// Averaging rounds: a group of peers sums one flat vector each (weighted contributions) and every
// member gets the sum, with no fixed world and no coordinator beyond the round.
//
// A round (run_round) has two phases, over TLS 1.3 channels (atom/wire.h):
//   group    the round's host is the candidate with the smallest id (deterministic from the
//            candidates: the live peers at the same swarm step, atom/swarm.h); each other member
//            connects to it and sends JOIN; the host waits until every candidate joined or the
//            gather deadline passed, then answers each JOIN with GROUP: the members (id and
//            address, sorted by id) and a fresh attempt token. A candidate that did not join in
//            time is left out of this attempt; one whose JOIN reaches a host after a round of that
//            number completed there hears at once that it came late, and one whose JOIN came
//            while the attempt ran hears so when it completes (it is then behind the others and
//            takes their state; a failed attempt's retry gathers those JOINs instead). The host hosts this attempt only: the next round's
//            host is chosen again from that round's candidates.
//   reduce   a butterfly all-reduce (as in Hivemind): the vector [N] is cut into one part per
//            member; member i owns part i. Each member sends part j of its contribution to member
//            j; owner i sums the parts (and the weights) and sends the sum back to every member;
//            the result is every part's sum in place. Each member sends and receives (n-1)/n of
//            the vector twice, the volume of a ring all-reduce, in two steps instead of 2(n-1).
//            Owner i combines the parts by swarm.aggregation (atom/robust_aggregation.h): the sum,
//            or a robust estimate times the weights summed, with how each member's part fared.
//            Pieces (round_pieces): under a robust rule part j is the vector's j-th n-th, one
//            piece (the rule needs it whole). Under mean the vector is cut into rows of n cells
//            (a whole number of kSparseChunk entries each, about kPiecesPerPart rows), cell j of
//            each row is a piece of part j, and pieces go from the last row to the first: the
//            order in which a backward makes gradients final, so a contribution still being
//            computed (atom/contribution.h) sends its pieces as they come. Owner i sends piece k
//            of its sum as soon as every member's piece k is in.
//            Each member's one sending thread goes through the others in shift order (member
//            me+1, me+2, ... mod n), giving each a band of kRowsPerBand rows of its pieces (each
//            once it is final) and the pieces of this member's sum summed so far; in step, every
//            link carries one flow each way at a time, as a ring's does. Each channel carries
//            one direction: member m's channel to member j carries m's pieces of part j and the
//            pieces of m's own sum, written by m and read by j's listener, so no reader waits on
//            a writer.
//            Ring (swarm.mean_all_reduce = ring, the default; the mean of three or more members, dense float32
//            parts): the same rows of n cells (ring_cell), and 2 (n - 1) steps per row, each
//            member sending to the next one only (me + 1 mod n): at step s < n - 1 its partial sum
//            of cell me - s (its own cell at s = 0, else the partial it received at step s - 1
//            plus its own), so that after step n - 2 it holds the whole sum of cell me + 1; then
//            n - 1 steps passing the whole sums on (averaging_ring.cpp). One TCP flow through each
//            link at a time (through tbf links a ring carried 74-81% of the rate where the
//            butterfly's shift order carried 66-70%: bench/results/link_flows_cpu.md). Rows go
//            last first and each unit goes as soon as what it needs is final and in, so rows
//            pipeline through the ring. Each cell's whole sum is computed by one member and
//            passed on as float32, so every member ends with the same bytes. Each member opens
//            its channel to the next with RING_OPEN before any unit, so the next one reads it from
//            the start; a failure anywhere closes that member's channel, which fails the next
//            member, and so on round the ring.
// Channels are kept between rounds: a member keeps its channel to each member of its last round
// (the JOIN channel to the host, a member too, among them) and opens only those it lacks, together
// before the first piece, while the links are idle; the listener's side serves request after
// request on one (a JOIN, an attempt's pieces and sums) until its member lets it go. A kept
// channel saves each round a TLS handshake per member and starts with TCP's estimate of the link
// instead of a fresh connection's. A channel is kept only when its last request completed (a
// failed attempt's are closed, so nothing stale is read as the next round's), and dropped when
// its peer is not in the next round or closed it.
// Parts travel as fp32, bf16 or int8 (per piece, symmetric with a float scale: the DiLoCo
// pseudo-gradients, swarm.pseudo_gradient_dtype), dense or sparse (each chunk's largest entries:
// swarm.topk_ratio; the sums then carry the union of the members' entries); sums are taken in
// fp32. A member learns what the round counted of its own contribution (RoundResult::delivered),
// so the caller can keep the rest for later rounds (error feedback). The messages and their
// checked parsing are atom/messages.h's.
//
// Failure. Every wait has a deadline (RoundClock: a multiple of the recent rounds' measured
// duration, within swarm.round_timeout_min_s and _max_s; the first round gets the maximum). A
// member that dies or stalls makes the round fail on the members waiting for it (a RoundError
// naming it); the caller keeps its contribution and retries with the candidates still alive, so a
// failed round loses nothing. The result is all-or-nothing except in one case: a member that
// loses its link to one owner after that owner summed may fail while the others succeed; its
// contribution was counted, and it finds itself one swarm step behind (Swarm::catch_up in
// atom/swarm.h brings it level then).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include <ATen/core/Tensor.h>

#include "atom/contribution.h"
#include "atom/messages.h"
#include "atom/wire.h"

namespace tessera::atom {

// The round messages' types on a channel (their layout: messages.h).
enum RoundMessage : uint8_t { kJoin = 10, kGroup = 11, kPart = 12, kSum = 13, kRing = 14, kRingOpen = 15 };

class RoundError : public Error {
 public:
  using Error::Error;
};



// The pieces [begin, end) of the vector (`numel` entries) that make up part `owner` of a round of
// `members`, in the order they travel (see reduce above): one contiguous piece, the vector's
// owner-th n-th, under a robust rule (`whole`) or for a vector of at most `members` chunks; else
// cell `owner` of each row, last row first, each a whole number of kSparseChunk entries (so a
// sparse piece keeps the entries it would keep whole). Every part has at least one piece.
constexpr int64_t kPiecesPerPart = 16;
constexpr int64_t kRowsPerBand = 4;
std::vector<std::pair<int64_t, int64_t>> round_pieces(int64_t numel, int64_t members, int64_t owner, bool whole);
// The ring's grid (ring above): its rows, and cell c of row t in travel order (t = 0 the last
// row), [begin, end) (empty where the vector ends before it). The cells are round_pieces' cells.
int64_t ring_rows(int64_t numel, int64_t members);
std::pair<int64_t, int64_t> ring_cell(int64_t numel, int64_t members, int64_t t, int64_t c);

struct RoundResult {
  at::Tensor sum;        // [N] float32: the members' contributions summed
  at::Tensor delivered;  // [N] float32: this member's contribution as the sum counted it (decoded)
  double weight = 0;     // their weights summed
  std::vector<RoundMember> members;
  bool ring = false;  // the sums went round a ring (Averager's `ring`), else the butterfly
  // The round's host's word on how rounds go (set_overlap_choice: 1 overlapped, 0 after the
  // backward), the same for every member of the group; -1: it says nothing.
  int overlap_choice = -1;
  // Under a robust rule (robust_aggregation.h): each member's share kept, averaged over the parts,
  // and whether it was an outlier of most parts; empty under mean.
  std::vector<Screening> screened;
  uint64_t bytes_sent = 0, bytes_received = 0;  // this member's, payload and framing
  double seconds = 0;
  // When each phase of the round ended here, in Unix seconds (the peers' per-round timeline,
  // bench/swarm_round_timeline.py): the round started; its group formed (the host's gather closed,
  // or a member's GROUP came); every contribution to this member's part was in (its last piece
  // summed); every sum came back.
  double started = 0, grouped = 0, part_summed = 0, finished = 0;
};

// Deadlines from measured round durations.
class RoundClock {
 public:
  RoundClock(double min_s, double max_s) : min_s_(min_s), max_s_(max_s) {}
  double deadline_s() const;  // 4 x the slowest of the last rounds, within [min, max]; max at first
  void record(double seconds);

 private:
  double min_s_, max_s_;
  std::vector<double> recent_;
};

class Averager {
 public:
  // `rule`: how this peer combines the contributions to the part it owns (every member must hold
  // the same: a part under another rule fails the round, naming the member).
  // `ring`: the mean of three or more members, dense float32, goes round a ring (above).
  Averager(const SwarmKey& key, std::string my_id, std::string my_address, size_t max_message_bytes,
           AggregationRule rule = {}, bool ring = false);

  // The Listener's handler for channels that open with a round message (returns false for any
  // other first message, which the caller handles). It serves the channel's requests until its
  // member closes it, a request fails, close() is called, or it stays idle kKeptIdleS.
  bool serve(Channel& channel, const Message& first);
  // Before the Listener stops: closes the kept channels and ends serve()'s waits between requests.
  void close();
  // The digest of this peer's newest state (atom/swarm.h), the one at swarm step `step`. A JOIN
  // carries it with its step, and the host leaves out of its group a joiner whose digest of the
  // same step differs from its own, telling it why: replicas that diverged never average together.
  // Digests of different steps are not compared: an overlapped round starts before the update
  // that makes its state, so its members may hold the digest of the step before or of this one
  // (a divergence is then found a round later).
  void set_state(int64_t step, const std::string& digest);
  // What this peer, hosting a round, tells its group about how rounds go (RoundResult's
  // overlap_choice; swarm.overlap_rounds = auto, atom/swarm.h): 1, 0, or -1 (nothing, the default).
  void set_overlap_choice(int choice);
  static constexpr double kKeptIdleS = 600;

  // One round over `candidates` (the live peers of this round, this one among them) with this
  // member's contribution `vector` [N] float32 and its `weight`; `round` names the swarm step, so
  // members of different steps never mix. Throws RoundError (the round failed here; nothing was
  // taken from the contribution) or returns the sum.
  // With `progress`, the contribution is still being computed (atom/contribution.h): `vector` is
  // then contiguous float32 and read only where `progress` marks it final, each piece sent once it
  // is; a withdrawal fails the round here (and, through their missing pieces, on the others).
  RoundResult run_round(int64_t round, std::vector<RoundMember> candidates, const at::Tensor& vector, double weight,
                        const PartEncoding& encoding, RoundClock& clock,
                        const std::shared_ptr<ContributionProgress>& progress = nullptr);

 private:
  struct Gather;  // the host's JOINs of one round
  struct Slot;    // one attempt's reduction on this member (averaging_reduce.cpp)
  struct RingSlot;  // one attempt's ring on this member (averaging_ring.cpp)
  // The group phase; either ends early, throwing RoundError, when `progress` is withdrawn.
  std::vector<RoundMember> host(int64_t round, const std::vector<RoundMember>& candidates, std::string& token,
                                Deadline gather, std::shared_ptr<Gather>& decided, const ContributionProgress* progress);
  std::vector<RoundMember> join(int64_t round, const RoundMember& host, std::string& token, Deadline deadline,
                                const ContributionProgress* progress, int& overlap_choice);
  // One request each; true when the channel is clean for its member's next request.
  bool serve_join(Channel& channel, const Message& first);
  // A member's channel of one attempt: its pieces of this member's part and its own part's sums
  // (`read_before`: the channel's bytes read before this attempt's first message).
  bool serve_part(Channel& channel, const Message& first, uint64_t read_before);
  // The kept channel to `member`, or a new one when none is kept (or its peer closed the kept one);
  // `sent_before`: its bytes sent so far (0 for a new one, so that its handshake counts).
  std::unique_ptr<Channel> channel_to(const RoundMember& member, Deadline deadline, uint64_t& sent_before);
  void keep(const RoundMember& member, std::unique_ptr<Channel> channel);
  // The reduce phase (averaging_reduce.cpp): fills `result` (sum, delivered, weight, screening,
  // bytes, part_summed) or throws RoundError.
  void reduce(int64_t round, const std::string& token, const std::vector<RoundMember>& members, int64_t me,
              const at::Tensor& flat, double weight, const PartEncoding& encoding, Deadline deadline,
              const ContributionProgress* progress, RoundResult& result);
  std::shared_ptr<Slot> slot_for(const std::string& token, bool create);
  // While a listener thread reads a channel of an attempt (Slot or RingSlot): on every way out the
  // attempt's bytes are counted and its reduce told the reader ended.
  template <class AttemptSlot>
  struct Reading {
    Averager& averager;
    AttemptSlot& slot;
    Channel& channel;
    uint64_t before;
    ~Reading() {
      std::lock_guard<std::mutex> lock(averager.mutex_);
      slot.bytes_received += channel.bytes_received() - before;
      --slot.readers;
      averager.changed_.notify_all();
    }
  };
  // The ring's reduce phase (averaging_ring.cpp), as reduce(); and the channel from the member
  // before this one (its units of this attempt).
  void reduce_ring(int64_t round, const std::string& token, const std::vector<RoundMember>& members, int64_t me,
                   const at::Tensor& flat, double weight, Deadline deadline, const ContributionProgress* progress,
                   RoundResult& result);
  bool serve_ring(Channel& channel, const Message& first, uint64_t read_before);
  // Piece k of this member's part has every contribution: its sum, encoded once for the writers.
  void sum_piece(const std::shared_ptr<Slot>& slot, size_t k);

  SwarmKey key_;
  std::string my_id_, my_address_;
  size_t max_bytes_;
  AggregationRule rule_;
  bool ring_ = false;
  std::mutex mutex_;
  std::string state_;  // set_state: the digest of the state at swarm step state_step_
  int64_t state_step_ = -1;
  int overlap_choice_ = -1;  // set_overlap_choice
  std::condition_variable changed_;
  std::map<int64_t, std::shared_ptr<Gather>> gathers_;
  std::deque<std::pair<int64_t, std::shared_ptr<Gather>>> closed_;  // the last rounds hosted here that completed
  std::map<std::string, std::shared_ptr<Slot>> slots_;
  std::map<std::string, std::shared_ptr<RingSlot>> ring_slots_;
  std::mutex kept_mutex_;
  std::map<std::string, std::pair<std::string, std::unique_ptr<Channel>>> kept_;  // by member id: address, channel
  std::atomic<bool> closing_{false};
};

}  // namespace tessera::atom
