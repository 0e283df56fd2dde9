// An ATOM swarm's step (`tessera peer`, atom/swarm.h; docs/atom.md) predicted without running:
// `peers` peers, each training a whole replica on one device (resident, or swapped with
// memory.swap: plan/swap_cost.h), averaging over the cluster's [peers] link. Peers are placed on
// the cluster's nodes as ranks are: where a node holds several (CPU cores), their compute slows
// by its sharing factor.
//
//   batch   one swarm step: each peer's share of swarm.target_batch_size (target / peers samples,
//           train.batch_size per micro-batch; its local step with its optimizer step, as one
//           device runs it), then one round of the float32 gradients, which the update waits for.
//           Overlapped rounds (swarm.overlap_rounds = always, where the peer has gradient leaves:
//           not fp16, not memory.swap; rounds_overlap) send each piece as the step's last backward
//           makes it final: that backward hides the round's transfer but its last row of pieces
//           (1 / kRoundRows of it, which follows the backward); the round's latencies and fixed
//           cost stay exposed. Unlike data parallelism's buckets (cost_model.cpp) the transfer
//           hides even where every core computes: it is the peers' link's time, which runs while
//           the cores compute (four peers on this machine's two cores: overlapped rounds 1.3x
//           rounds after the backward at 100 Mbit, bench/plan_slow_links.py).
//           The round's CPU (round_cpu: [peers] cpu_ns_per_byte, TLS both ways, the sockets, the
//           sums) bounds its transfer from below where the link is faster than the cores. Where
//           the device is a CPU, that work runs on the cores the peers compute on, slowed as
//           their products are when the node's ranks all run (cluster.shared_slowdown): an
//           overlapped round adds it to the backward ("swarm_round_cpu" in the breakdown; at 1
//           Gbit on shared cores it costs the local step about what the overlap hides), a round
//           after the backward takes at least that long. swarm.overlap_rounds = auto: the faster
//           of the two ways, which the swarm's probe finds (its 4 rounds in 200 are not priced).
//   diloco  one local step of every peer (train.batch_size x train.grad_accum samples and the local
//           optimizer step) plus 1 / swarm.inner_steps of a round of the pseudo-gradient
//           (pseudo_gradient_dtype: 4, 2 or 1 bytes per element; with topk_ratio < 1 the sent
//           entries only, each with a 2-byte index) and of the outer Nesterov step on the host (24
//           bytes per element at host.optimizer_gbs, or the device's bandwidth without one); the
//           round takes at least its CPU (round_cpu), as a batch round after the backward does
// A round (atom/averaging.h): each member sends and receives (n - 1) / n of the vector twice,
// 2 (n - 1) / n bytes / bandwidth, plus peers.round_overhead_ms; by the butterfly in two steps (2
// latencies), round a ring (batch mode's mean of three or more peers under
// swarm.mean_all_reduce = ring, the default) in 2 (n - 1). Low-rank pseudo-gradients
// (swarm.pseudo_gradient_rank) are not priced (refused by key).
//
// The prediction's step_s is the swarm step (batch) or the local step (diloco); tokens_per_s counts
// every peer's tokens; the memory is one peer's device.
#pragma once

#include <cstdint>

#include "config/config.h"
#include "plan/cluster.h"
#include "plan/cost_model.h"

namespace tessera::plan {

// The one-device config each peer runs: the config with every parallel degree 1, and the samples
// of its local step (batch: the peer's share of the target; diloco: the config's local step).
Config peer_config(const Config& config, int64_t peers);

Prediction predict_swarm(const Config& config, int64_t peers, const Cluster& cluster, const CostOptions& options = {},
                         bool with_memory = true);

// Seconds of one round of `bytes` over the peers' link (above), `steps` latencies (2 for the
// butterfly, 2 (n - 1) round a ring).
double swarm_round_seconds(double bytes, int64_t peers, const Cluster& cluster, int64_t steps = 2);

// A round's CPU for one peer sending 2 (n - 1) / n of `bytes` (above): its seconds, stretched by
// the node's sharing where it runs on the compute's cores (a CPU device).
struct RoundCpu {
  double seconds = 0;
  bool on_compute_cores = false;
};
RoundCpu round_cpu(double bytes, int64_t peers, const Cluster& cluster);

// Whether a batch-mode peer under `config` starts its rounds with the local step (above).
bool rounds_overlap(const Config& config);
// The rows of pieces a round's mean travels in (atom/averaging.h kPiecesPerPart): the last one's
// transfer follows the backward.
constexpr double kRoundRows = 16;

}  // namespace tessera::plan
