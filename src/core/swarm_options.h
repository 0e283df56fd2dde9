// The [swarm] section: how an ATOM peer (`tessera peer`, atom/swarm.h) trains with the others of
// its swarm. Who the peer is (its swarm's name, its address, the peers it starts from) is given on
// the command line, not here: a config is shared by every peer of a swarm.
//
//   sync = "batch"   peers accumulate gradients until the swarm together has processed
//                    target_batch_size samples, average them weighted by samples and all take the
//                    same optimizer step (synchronous training with that global batch);
//                    overlap_rounds says whether a round starts with the local step that closes it;
//   sync = "diloco"  each peer takes inner_steps local steps, then the group averages the
//                    pseudo-gradients (start parameters minus local parameters, sent as
//                    pseudo_gradient_dtype) and applies an outer Nesterov SGD step (outer_lr,
//                    outer_momentum; DiLoCo's defaults 0.7 and 0.9). With topk_ratio < 1 a peer
//                    sends only the largest entries of each chunk of its pseudo-gradient (plus
//                    what earlier rounds left unsent, times error_feedback_decay: error feedback,
//                    as SparseLoCo). With pseudo_gradient_rank = r > 0 each matrix travels as a
//                    rank-r product instead (PowerSGD's power iteration, one side per round,
//                    atom/low_rank.h), with the same error feedback.
// A swarm is closed: key_file holds the shared secret every connection and DHT record proves
// knowledge of (atom/swarm_key.h); a peer without one is refused before it starts.
#pragma once

#include <cstdint>
#include <string>

#include "core/options.h"

namespace tessera {

struct SwarmOptions {
  std::string sync = "batch";           // batch | diloco
  int64_t target_batch_size = 64;       // batch: samples over the swarm per optimizer step
  std::string overlap_rounds = "always";  // batch: always | never | auto: a round starts with the local step that closes it
  std::string mean_all_reduce = "ring";  // ring | butterfly: how a round's dense float32 mean travels (atom/averaging.h)
  int64_t inner_steps = 50;             // diloco: local steps between averages
  double outer_lr = 0.7;                // diloco: outer SGD learning rate
  double outer_momentum = 0.9;          // diloco: outer Nesterov momentum
  std::string pseudo_gradient_dtype = "bf16";  // diloco: fp32 | bf16 | int8 on the wire
  double topk_ratio = 1;                // diloco: fraction of each chunk's entries sent (1: all)
  int64_t pseudo_gradient_rank = 0;     // diloco: matrices as rank-r products (PowerSGD; 0: whole)
  double error_feedback_decay = 1;      // diloco with top-k or a rank: the residual's factor before each round
  std::string aggregation = "mean";     // mean | centered_clip | trimmed_mean | median (atom/robust_aggregation.h)
  double clip_radius = 2;               // centered_clip: the clipping radius over the members' median distance
  double trim_fraction = 0.25;          // trimmed_mean: the share of members dropped at each end of every entry
  std::string key_file;                 // the swarm's shared key (tessera swarm keygen)
  int64_t min_peers = 1;                // peers seen before the first local step
  double join_timeout_s = 60;           // with --initial-peer: the wait to see another live peer, and to take the state
  double record_ttl_s = 10;             // a peer whose record is older is gone
  double publish_interval_s = 1;        // how often a peer republishes its record
  double round_timeout_min_s = 5;       // the adaptive round deadline's bounds
  double round_timeout_max_s = 300;
  double max_message_mb = 4096;         // a larger message from a peer is refused
  double replay_mb = 256;               // batch: the last rounds' means kept for peers to replay

  template <class V>
  void visit(V& v) {
    v("sync", sync, "batch (accumulate to target_batch_size, average gradients) or diloco (average "
                    "pseudo-gradients every inner_steps local steps)");
    v("target_batch_size", target_batch_size, "batch: samples the swarm processes per optimizer step",
      between(1, int64_t{1} << 40));
    v("overlap_rounds", overlap_rounds, "batch: always starts the round a local step will close when that step "
      "starts (its group forms during the step, and each piece of the gradients goes out as soon as the backward "
      "made it final, as data parallelism's buckets do); never starts it after the backward (where compute and "
      "communication share every core, as several peers on one CPU host, overlapping can lose at fast links); auto "
      "lets the swarm time both ways on the same rounds (swarm steps 2-5, and every 200 after) and each round's host "
      "tell its group the faster one it timed, which every member follows from its next round. fp16 and "
      "memory.swap rounds start after the backward either way");
    v("mean_all_reduce", mean_all_reduce, "how a round of three or more members sums a dense float32 mean: "
      "ring (each member sends to the next only, 2 (n - 1) steps: one TCP flow through each link; at 10 Mbit it "
      "carried 1.01-1.13x data parallelism's samples/s where the butterfly carried 0.88-1.04x) or butterfly (each "
      "member owns a part and sends its sum back: two hops); robust rules and encoded parts always use the "
      "butterfly");
    v("inner_steps", inner_steps, "diloco: local optimizer steps between averaging rounds", between(1, 1 << 24));
    v("outer_lr", outer_lr, "diloco: learning rate of the outer Nesterov SGD step", between(0, 100));
    v("outer_momentum", outer_momentum, "diloco: momentum of the outer Nesterov SGD step", fraction_below_one());
    v("pseudo_gradient_dtype", pseudo_gradient_dtype, "diloco: what pseudo-gradients travel as: fp32, bf16 or int8");
    v("topk_ratio", topk_ratio, "diloco: fraction of each 4096-entry chunk of the pseudo-gradient a peer sends, "
      "the largest in magnitude, keeping the rest for later rounds (error feedback); 1 sends every entry",
      above(0, 1));
    v("pseudo_gradient_rank", pseudo_gradient_rank, "diloco: with r > 0 each matrix of the pseudo-gradient travels as "
      "its product with a rank-r factor every peer holds (PowerSGD's power iteration, one side per round), keeping "
      "the rest for later rounds (error feedback); 0 sends every entry", between(0, 1 << 20));
    v("error_feedback_decay", error_feedback_decay, "diloco with topk_ratio < 1 or pseudo_gradient_rank > 0: the "
      "residual is multiplied by this "
      "before it joins the next pseudo-gradient (1 keeps all of it; SparseLoCo's beta)", between(0, 1));
    v("aggregation", aggregation, "how the owner of each part of a round combines the members' contributions: "
      "mean, or centered_clip, trimmed_mean or median, which a member sending poisoned contributions cannot move "
      "far (every peer of the swarm must use the same)");
    v("clip_radius", clip_radius, "centered_clip: contributions farther from the estimate than this many times the "
      "members' median distance are clipped to it", between(0.1, 1000));
    v("trim_fraction", trim_fraction, "trimmed_mean: the share of the members whose values are dropped at each end "
      "of every entry (at least one member of three or more, at most (n - 1) / 2)", between(0, 0.5));
    v("key_file", key_file, "file holding the swarm's shared key (tessera swarm keygen --out FILE); required");
    v("min_peers", min_peers, "live peers (this one included) a peer waits to see before its first step",
      between(1, 1 << 20));
    v("join_timeout_s", join_timeout_s, "a peer started with --initial-peer that sees no other live peer of its "
      "swarm within this many seconds fails instead of training alone; also the limit on taking the state of the "
      "peers ahead at start", between(0.1, 86400));
    v("record_ttl_s", record_ttl_s, "a peer whose last DHT record is older than this is taken as gone",
      between(0.5, 86400));
    v("publish_interval_s", publish_interval_s, "seconds between a peer's DHT records", between(0.05, 3600));
    v("round_timeout_min_s", round_timeout_min_s, "lower bound of an averaging round's adaptive deadline",
      between(0.1, 86400));
    v("round_timeout_max_s", round_timeout_max_s, "upper bound of an averaging round's adaptive deadline",
      between(0.1, 86400));
    v("max_message_mb", max_message_mb, "messages from a peer larger than this are refused", between(0.001, 1 << 20));
    v("replay_mb", replay_mb, "batch: megabytes of the newest rounds' averaged gradients a peer keeps, which a peer "
      "that fell behind replays instead of downloading the whole state (one round is 4 bytes per parameter; 0 keeps "
      "none)", between(0, 1 << 20));
  }

  void check(const std::string& source) const;
};

}  // namespace tessera
