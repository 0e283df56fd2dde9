// Swarm: one ATOM peer's membership of its swarm, as the training loop's Collaboration
// (train/collaboration.h). `tessera peer` (cli/peer_command.cpp) makes one and trains with it.
//
// A peer is one process training a whole replica of the model (resident, or swapped through its
// device under memory.swap: the ATOM configuration). It runs:
//   - a Listener (atom/wire.h) on --listen HOST:PORT (TCP): averaging rounds and state downloads
//     from the other peers, each connection authenticated by the swarm key;
//   - a DHT node (atom/membership.h) on the same HOST:PORT (UDP), bootstrapped from any live peer
//     (--initial-peer), where it republishes its record every swarm.publish_interval_s: its
//     address, swarm step, samples accumulated and claimed, loss and throughput;
//   - the training loop's hooks:
//       batch   (swarm.sync = batch) an outer reduction of each local step's final gradients
//               (TrainStep::set_outer_reduction): they join the peer's accumulation (sum of
//               gradient x micro-batches, and the micro-batches); once the swarm's samples (the
//               accumulated and the claimed of every live peer at this swarm step) reach
//               swarm.target_batch_size, an averaging round (atom/averaging.h) over those peers
//               sums the accumulations, and every member writes sum / micro-batches into its
//               gradients and updates: one synchronous step with the swarm's batch. A failed round
//               keeps the accumulation (nothing lost) and is retried after the next local step.
//               Overlapped rounds (swarm.overlap_rounds, swarm_overlap.cpp): when a local step
//               starts and the swarm's samples will reach the target with it (by the same count,
//               taken then), its round starts on a thread of its own: the group forms while the
//               step runs, and the contribution (the accumulation plus the step's gradients x its
//               samples) goes out piece by piece as each parameter's post-accumulate hook in the
//               step's last backward makes it final (atom/contribution.h). The step's end waits
//               for the round and goes on as above; the sums are the same numbers either way.
//               Where gradients are final only after the backward (fp16, memory.swap: no
//               GradientHolder::gradient_leaves) rounds start after it, as they do when the count
//               says the target is not reached yet.
//               swarm.overlap_rounds = auto (swarm_overlap.cpp): every peer probes both ways on the
//               same rounds (kProbeRounds from swarm step kFirstProbe, and again every
//               kReprobeAfter: overlapped at even steps, after the backward at odd ones) and times
//               each round's period (from the round before: its local step and its round); after
//               a probe it prefers the faster way it timed. A round's host tells its group the way
//               it prefers (or, with no probe of its own, the way it follows) in the GROUP
//               (RoundResult::overlap_choice), and every member, the host too, follows that from
//               its next round: the members of a group never mix the ways, which lost to either
//               way alone (a swarm whose peers each kept the way they timed ran 84.5 samples/s at
//               1 Gbit against 120.0 always and 103.2 never, one of four choosing the other way).
//       diloco  (swarm.sync = diloco) every swarm.inner_steps local steps: the pseudo-gradient
//               (the parameters at the last outer step minus the current ones) averaged over the
//               live peers at this swarm step, sent as swarm.pseudo_gradient_dtype (with
//               swarm.topk_ratio < 1 only each chunk's largest entries: what a round leaves unsent
//               stays in the peer's residual and joins its next pseudo-gradient, times
//               swarm.error_feedback_decay; with swarm.pseudo_gradient_rank > 0 each matrix as a
//               low-rank product instead, atom/low_rank.h, with the same residual), then an outer
//               Nesterov SGD step (swarm.outer_lr, swarm.outer_momentum) from the last outer
//               parameters, written into the masters (GradientHolder::master_parameters).
// Joining: a peer started from --initial-peer sees at least one other live peer before its first
// step (else, within swarm.join_timeout_s, it fails naming the addresses: it never trains alone
// split off from the swarm it was pointed at). A peer whose swarm step is below a live peer's (a
// late joiner, a restarted peer that missed rounds, a member that lost a round's result) never
// trains on its own state. In batch mode, holding a state of the swarm (it took part in a round,
// downloaded a state or restarted from its checkpoint), it replays the rounds it missed from the
// logs of the peers ahead (atom/round_log.h: every peer keeps its last rounds' means within
// swarm.replay_mb), as updates alone; otherwise, or where no log reaches back, it downloads the
// newest state from every live peer ahead of it (atom/state_transfer.h; under DiLoCo the state the
// peers share, its inner optimizer state staying its own, and a DiLoCo peer that finds peers ahead
// at its outer step takes their state instead of a round alone). Either way it drops what
// it had accumulated on the old parameters (counted in its log); peers serve their snapshot
// between two steps when asked.
// Replicas that diverged: peers at one swarm step must hold one state (the invariant below), but
// peers that lost sight of each other (a stalled round, DHT records expired over saturated links)
// each take rounds alone, and a corrupted update (a flipped bit) splits one replica off silently;
// averaging gradients on different parameters never brings them back together. So each peer
// publishes its state's digest in its record (core/flat_tensors.h tensors_digest, every bit of
// its master parameters in batch mode, of its outer parameters under DiLoCo; computed after each
// update that advanced its swarm step, after a catch-up and at attach, once it holds a state of
// the swarm). Among the live peers at its swarm step the state most of them hold is the swarm's
// (a tie, e.g. two peers: the smallest digest, so that every peer picks the same); a peer holding
// another says so in its log, counts it (metrics' state_divergences) and takes that state as a
// peer behind does (ahead_of), and the others leave it out of their rounds and counts until its
// record shows the swarm's state.
// Aggregation: each part of a round is combined by swarm.aggregation at its owner
// (atom/robust_aggregation.h); under a robust rule every member logs the round's outliers and
// publishes, as its record's suspects, the members that were outliers in most of their recent
// rounds (`tessera swarm status` shows them).
// Identity: a peer's id (32 random hex digits, kept in its run directory's peer.json, so a restart
// is the same peer) orders the candidates of a round and seeds its data stream.
//
// Invariant (batch): peers at the same swarm step hold the same parameters and optimizer state;
// a round is taken by every member or by none, save the one case averaging.h names.
#pragma once

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <ATen/core/Tensor.h>

#include "atom/averaging.h"
#include "atom/low_rank.h"
#include "atom/membership.h"
#include "atom/poison.h"
#include "atom/round_log.h"
#include "atom/state_transfer.h"
#include "config/config.h"
#include "train/collaboration.h"

namespace tessera::atom {

struct PeerIdentity {
  std::string swarm;   // --swarm NAME
  std::string id;      // 32 hex digits (peer.json)
  std::string listen;  // --listen HOST:PORT
  std::vector<std::string> initial_peers;  // --initial-peer HOST:PORT ...
  std::string run_dir;  // where its state snapshots for joiners go (RUN_DIR/swarm_state)
};

// The run directory's peer.json: the peer's id and swarm, made on the first start (a random id)
// and read on every later one; a run directory of another swarm is refused.
PeerIdentity load_or_create_identity(const std::string& run_dir, const std::string& swarm);

class Swarm final : public Collaboration {
 public:
  Swarm(PeerIdentity identity, const Config& config);
  ~Swarm() override;

  uint64_t data_seed(uint64_t configured) const override;
  int64_t attach(TrainStep& step, int64_t step_number, const nlohmann::json& meta,
                 const std::map<std::string, at::Tensor>& tensors) override;
  void after_update(TrainStep& step, int64_t step_number) override;
  std::optional<int64_t> after_local_step(TrainStep& step, int64_t samples, double loss, double seconds) override;
  std::vector<std::string> take_messages() override;
  nlohmann::json metrics() const override;
  nlohmann::json checkpoint_state() const override;
  NamedTensors checkpoint_tensors() const override;
  void leave() override;

  const std::string& address() const { return identity_.listen; }
  // The live peers as the DHT shows them now (tessera swarm status, tests).
  std::vector<PeerRecord> live_peers() { return membership_->live_peers(); }

 private:
  bool reduce(const std::vector<at::Tensor>& gradients, int64_t samples);  // batch mode
  // A local step's end without an overlapped round: the round starts here when due.
  bool reduce_after_step(const std::vector<at::Tensor>& gradients, int64_t samples, double entered);
  // Overlapped rounds (swarm_overlap.cpp). At a local step's start: the round it will close, when
  // the count says so. From a leaf's post-accumulate hook: its gradient's share of the contribution.
  // At the step's end: the round finished as reduce() would (true: the mean is in the gradients).
  // Cancelled: withdrawn and joined (the peer leaves).
  void install_leaf_hooks();  // at attach, when rounds may overlap
  void start_overlapped_round();
  void leaf_gradient_final(size_t leaf);
  // Parameter `leaf`'s share, outgoing = accumulation + gradient x samples, written and marked
  // done; whether it is finite.
  struct OverlappedRound;  // below
  bool add_share(OverlappedRound& o, size_t leaf, const at::Tensor& gradient);
  bool finish_overlapped_round(const std::vector<at::Tensor>& gradients, int64_t samples, double entered);
  void cancel_overlapped_round(const std::string& why);
  // swarm.overlap_rounds (above): whether the round at swarm step `step` is to overlap (it does
  // where the count says so at its step's start); a round taken, its period counted for the way
  // its step was to go, whether or not this peer's round did (the way is the swarm's setting, and
  // the first peer to finish a round often sees the others' claims too late to overlap the next);
  // a probe's last round: the preference decided; the way the round's host told the group,
  // followed from the next round.
  bool overlap_round(int64_t step) const;
  static bool probing(int64_t step);
  void time_round();
  void follow_host(const RoundResult& result);
  // What this peer tells the groups it hosts (auto): its preference, or without one the way it follows.
  void tell_hosted_groups();
  // The swarm's samples at this swarm step as the records `live` show them: `own`, and each other
  // peer's accumulated and claimed.
  int64_t swarm_samples(const std::vector<PeerRecord>& live, int64_t own) const;
  // The round's accounting after it: the step's samples accumulated (or dropped when not
  // `contributed`), claimed for the next step, published.
  void count_step(int64_t samples, bool contributed);
  // After a round that averaged: the mean written into the step's gradients, logged, counted.
  void take_round(const RoundResult& result, const std::vector<at::Tensor>& gradients, double entered,
                  double claims_seen, bool overlapped);
  void outer_step(TrainStep& step);                                            // diloco
  // The peers whose state this peer takes: those of `live` at a higher swarm step than this one's,
  // or, when none is and this peer's state is not the swarm's at its step (replicas that diverged,
  // above), those holding the swarm's (logged once a step). peers_ahead(): of the live peers the
  // DHT shows now.
  std::vector<PeerRecord> ahead_of(const std::vector<PeerRecord>& live);
  std::vector<PeerRecord> peers_ahead();
  // This peer's state digest at its swarm step, or empty while it is unknown (after a round,
  // before the update's digest; a peer holding no state of the swarm). Whether `r` may hold this
  // peer's state: its digest or this peer's unknown, or the same.
  std::string current_state() const;
  bool same_state(const PeerRecord& r) const;
  // This peer's state digest, computed now and published (nothing before it holds a state of the swarm).
  void refresh_state_digest();
  // The candidates of this swarm step's round (live peers at it with this peer's state, this one included).
  std::vector<RoundMember> candidates(const std::vector<PeerRecord>& live) const;
  void publish();
  // After a round this peer took: its accumulation counted as contributed, the step advanced,
  // the traffic counted, a line for the log, the record republished.
  void finish_round(const RoundResult& result, const std::string& what, const std::string& detail);
  // Under a robust rule: the round's outliers logged, and the members that were outliers in most
  // of their last kScreenedRounds rounds (at least 3) published as suspects.
  void screen(const RoundResult& result);
  // The last round's timeline (metrics' swarm.round_times): when this peer's reduction began
  // (its local step's backward done), when it had the others' fresh claims (batch; for a round
  // that started with its local step, `overlapped`, when it decided to start it: before
  // `entered`, while its round thread may record `started` on either side of `entered`), and the
  // round's phases (RoundResult), all Unix seconds.
  void note_round_times(const RoundResult& result, double entered, double claims_seen, bool overlapped);
  // What this peer sends in a round: `contribution`, or its poison (TESSERA_SWARM_POISON, poison.h).
  at::Tensor sent(const at::Tensor& contribution);
  // The state a joiner downloads (state_transfer.h); loading one, returning the step to go on from
  // (nullopt, with a line in the log and the reason in transfer_error_, when the download failed
  // within `deadline`: nothing was loaded).
  NamedTensors snapshot_tensors(TrainStep& step);
  std::optional<int64_t> load_state(TrainStep& step, const std::vector<PeerRecord>& ahead, Deadline deadline);
  // A peer behind `ahead` catches up: in batch mode, when it holds a state of the swarm, by
  // replaying the rounds it missed from the peers' logs (atom/round_log.h); else, or where no log
  // reaches back, by taking the state (load_state). The step to go on from, or nullopt.
  std::optional<int64_t> catch_up(TrainStep& step, const std::vector<PeerRecord>& ahead, Deadline deadline);
  // Applies the rounds from this peer's swarm step to the newest of `ahead`, each fetched from a
  // peer ahead of it, as updates alone (GradientHolder::apply_written_gradients at the round's
  // learning rate); true when it got there. Rounds replayed before a missing one are kept (each
  // leaves a state of the swarm).
  bool replay(const std::vector<PeerRecord>& ahead, Deadline deadline);
  // The samples accumulated on parameters that were just replaced: counted as dropped.
  void drop_accumulated();
  void say(const std::string& line);
  void serve(std::unique_ptr<Channel> channel);
  // A checkpoint's or snapshot's tensor `name` as float32, or undefined when absent.
  static at::Tensor swarm_tensor(const std::map<std::string, at::Tensor>& tensors, const std::string& name);

  PeerIdentity identity_;
  Config config_;
  SwarmKey key_;
  std::unique_ptr<Averager> averager_;
  std::unique_ptr<Listener> listener_;
  std::unique_ptr<Membership> membership_;
  RoundClock clock_;
  PartEncoding encoding_;  // how this peer's contributions travel
  GradientHolder* holder_ = nullptr;
  std::unique_ptr<StateSnapshots> snapshots_;
  std::unique_ptr<RoundLog> round_log_;  // batch: the last rounds' means, for peers that replay them
  bool behind_ = false;  // batch: live peers are ahead; the next local step's end downloads their state
  std::string transfer_error_;  // why the last download of the swarm's state failed

  // Guards what the publisher thread reads (publish(): the record, swarm_step_, accumulated_) and
  // messages_: the training thread writes them under it (it alone writes them, so its own reads
  // need no lock). Found by ThreadSanitizer: a restarted peer's attach wrote them unlocked.
  mutable std::mutex mutex_;
  PeerRecord record_;
  std::vector<std::string> messages_;
  int64_t swarm_step_ = 0;
  int64_t accumulated_ = 0;   // samples since the last round (batch) or outer step (diloco);
                              // record_.claimed: the samples of one local step, claimed for the running one
  at::Tensor accumulation_;   // batch: [N] float32, sum of each local step's gradient x its samples
  at::Tensor outer_start_, outer_momentum_;  // diloco: parameters at the last outer step, momentum
  at::Tensor residual_;  // diloco with top-k or a rank: what the rounds left unsent of this peer's pseudo-gradients
  std::unique_ptr<LowRankPseudoGradients> low_rank_;  // diloco with swarm.pseudo_gradient_rank > 0
  at::Tensor factors_;   // its factors, equal on every peer at the same swarm step
  int64_t inner_ = 0;                        // diloco: local steps since the last outer step
  bool holds_swarm_state_ = false;  // after a round, a download or a restart (a fresh peer holds its own init)
  std::string state_digest_;  // of this peer's state at swarm step digest_step_ (published when that is swarm_step_)
  int64_t digest_step_ = -1;
  int64_t state_divergences_ = 0, diverged_step_ = -1;  // times its state was not the swarm's; the last step it was
  int64_t rounds_ = 0, failed_rounds_ = 0;
  double step_started_ = 0;  // Unix seconds when the local step now running began
  uint64_t bytes_sent_ = 0, bytes_received_ = 0;
  // Every local step's samples end in exactly one of: averaged in a round (contributed), dropped
  // for the others' state (dropped), or still accumulated: processed = contributed + dropped + accumulated.
  int64_t samples_processed_ = 0, samples_contributed_ = 0, samples_dropped_ = 0;

  // Overlapped rounds: the parameters whose gradients are sent as they become final (empty: the
  // rounds start after the backward), each's offset in the flat contribution, and the round of the
  // local step now running (null when none).
  struct OverlappedRound {
    int64_t swarm_step = 0, samples = 0;  // the round's number; the step's samples it counts on
    double decided = 0;                   // Unix seconds
    at::Tensor outgoing;                  // [N] float32: the accumulation plus the step's share, as final
    std::shared_ptr<ContributionProgress> progress;
    std::vector<int64_t> arrivals;        // per leaf: post-accumulate hooks in this step
    std::vector<char> done;               // per leaf: its share is in `outgoing`
    std::thread thread;
    RoundResult result;
    std::string error;  // the round failed: why
  };
  struct LeafHooks {  // what the parameters' hooks reach: this Swarm until it leaves (the hooks outlive it)
    std::atomic<Swarm*> swarm{nullptr};
  };
  std::vector<at::Tensor> leaves_;
  std::vector<int64_t> leaf_offsets_;
  std::shared_ptr<LeafHooks> leaf_hooks_;
  std::unique_ptr<OverlappedRound> overlapped_;
  int64_t overlapped_rounds_ = 0;  // rounds taken that had started with their local step
  int64_t ring_rounds_ = 0;        // rounds taken whose sums went round a ring
  static constexpr int64_t kFirstProbe = 2, kProbeRounds = 4, kReprobeAfter = 200;
  bool overlap_followed_ = true;     // auto: the way the last round's host told its group
  int overlap_preferred_ = -1;       // auto: the faster way this peer timed in its last probe (-1: none)
  std::vector<double> probe_periods_[2];  // auto: this probe's round periods, after / overlapped
  double last_round_end_ = 0;        // Unix seconds when the last round was taken, at swarm step
  int64_t last_round_step_ = -1;     // last_round_step_

  std::unique_ptr<Poison> poison_;
  static constexpr size_t kScreenedRounds = 20;
  std::map<std::string, std::deque<bool>> outlier_history_;  // by member: its last rounds, outlier or not
  int64_t outliers_ = 0;  // in the last round
  nlohmann::json round_times_;  // note_round_times

  std::atomic<bool> leaving_{false};
  std::thread publisher_;
};

}  // namespace tessera::atom
