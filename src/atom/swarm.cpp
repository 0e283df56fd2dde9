// One peer's swarm: its identity, attaching to a training step, publishing its record, serving
// other peers' requests, and its metrics and checkpoint state (swarm.h). Rounds are in
// swarm_rounds.cpp, catching up in swarm_catch_up.cpp.
#include "atom/swarm.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <utility>

#include <ATen/ATen.h>

#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "core/flat_tensors.h"
#include "core/fs.h"
#include "core/json_file.h"
#include "core/splitmix.h"

namespace tessera::atom {

PeerIdentity load_or_create_identity(const std::string& run_dir, const std::string& swarm) {
  const std::string path = run_dir + "/peer.json";
  PeerIdentity identity;
  identity.swarm = swarm;
  if (std::filesystem::exists(path)) {
    const nlohmann::json j = read_json_file(path);
    identity.id = meta_field<std::string>(j, "id", path);
    const std::string was = meta_field<std::string>(j, "swarm", path);
    require(was == swarm, path, ": this run directory is a peer of swarm '", was, "', not '", swarm,
            "' (--swarm); use another --out");
    require(identity.id.size() == 32 && identity.id.find_first_not_of("0123456789abcdef") == std::string::npos, path,
            ": 'id' must be 32 hex digits");
    return identity;
  }
  std::filesystem::create_directories(run_dir);
  identity.id = to_hex(random_bytes(16));
  write_file_atomic(path, nlohmann::json{{"id", identity.id}, {"swarm", swarm}}.dump(2) + "\n");
  return identity;
}

Swarm::Swarm(PeerIdentity identity, const Config& config)
    : identity_(std::move(identity)),
      config_(config),
      key_(SwarmKey::load(config.swarm.key_file)),
      clock_(config.swarm.round_timeout_min_s, config.swarm.round_timeout_max_s),
      encoding_(config.swarm.sync == "batch"
                    ? PartEncoding{}
                    : PartEncoding{codec_from_name(config.swarm.pseudo_gradient_dtype), config.swarm.topk_ratio < 1,
                                   config.swarm.topk_ratio}) {
  const auto [host, port] = split_address(identity_.listen, "--listen");
  const auto max_bytes = static_cast<size_t>(config.swarm.max_message_mb * 1e6);
  listener_ = std::make_unique<Listener>(
      host, port, key_, identity_.id, max_bytes, [this](std::unique_ptr<Channel> c) { serve(std::move(c)); },
      [this](const std::string& address, const std::string& reason) {
        say("a connection from " + address + " ended: " + reason);
      });
  identity_.listen = host + ":" + std::to_string(listener_->port());
  averager_ = std::make_unique<Averager>(
      key_, identity_.id, identity_.listen, max_bytes,
      AggregationRule{aggregation_from_name(config.swarm.aggregation), config.swarm.clip_radius,
                      config.swarm.trim_fraction},
      config.swarm.mean_all_reduce == "ring");
  tell_hosted_groups();
  poison_ = Poison::from_environment();
  if (poison_)
    say("TESSERA_SWARM_POISON=" + poison_->mode() + ": " + poison_->what());
  snapshots_ = std::make_unique<StateSnapshots>(identity_.run_dir + "/swarm_state");
  round_log_ = std::make_unique<RoundLog>(static_cast<int64_t>(config.swarm.replay_mb * 1e6));
  membership_ = std::make_unique<Membership>(identity_.swarm, key_, host, listener_->port(), identity_.initial_peers,
                                             config.swarm.record_ttl_s);
  record_.id = identity_.id;
  record_.address = identity_.listen;
  record_.claimed = config.train.batch_size * config.train.grad_accum;
  publisher_ = std::thread([this] {
    while (!leaving_) {
      publish();
      const auto until = std::chrono::steady_clock::now() +
                         std::chrono::duration<double>(config_.swarm.publish_interval_s);
      while (!leaving_ && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
}

Swarm::~Swarm() { leave(); }

void Swarm::leave() {
  if (leaving_.exchange(true)) return;
  cancel_overlapped_round("the peer is leaving");
  if (leaf_hooks_) leaf_hooks_->swarm = nullptr;
  if (publisher_.joinable()) publisher_.join();
  averager_->close();
  listener_->stop();
}

uint64_t Swarm::data_seed(uint64_t configured) const {
  return splitmix64(configured ^ std::stoull(checksum(identity_.id), nullptr, 16));
}

void Swarm::say(const std::string& line) {
  std::lock_guard<std::mutex> lock(mutex_);
  messages_.push_back("swarm: " + line);
}

std::vector<std::string> Swarm::take_messages() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::string> out;
  out.swap(messages_);
  return out;
}

void Swarm::publish() {
  PeerRecord r;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    record_.swarm_step = swarm_step_;
    record_.samples = accumulated_;
    record_.state = current_state();
    record_.time = unix_now();
    r = record_;
  }
  membership_->publish(r);
}

void Swarm::serve(std::unique_ptr<Channel> channel) {
  // A round member opens the channels it lacks to the others at once and sends to each in turn, so
  // a channel may wait out the stages before its own (averaging.h): the longest round may pass.
  const Message first = channel->receive(Deadline::in(std::max(30.0, config_.swarm.round_timeout_max_s)));
  if (averager_->serve(*channel, first) || snapshots_->serve(*channel, first) || round_log_->serve(*channel, first))
    return;
  throw WireError("peer " + channel->address() + " sent an unknown request (type " + std::to_string(first.type) + ")");
}

int64_t Swarm::attach(TrainStep& step, int64_t step_number, const nlohmann::json& meta,
                      const std::map<std::string, at::Tensor>& tensors) {
  holder_ = step.gradient_holder();
  require(holder_, "tessera peer trains one whole replica per process: this layout shards it over ranks");
  if (!meta.is_null()) {
    const std::string source = "the checkpoint's meta.json 'collaboration'";
    // The publisher thread reads these (publish()): under the lock, as everywhere else.
    std::lock_guard<std::mutex> lock(mutex_);
    holds_swarm_state_ = true;
    swarm_step_ = meta_field<int64_t>(meta, "swarm_step", source);
    accumulated_ = meta_field<int64_t>(meta, "accumulated_samples", source);
    inner_ = meta_field<int64_t>(meta, "inner_steps_done", source);
    samples_processed_ = meta_field<int64_t>(meta, "samples_processed", source);
    samples_contributed_ = meta_field<int64_t>(meta, "samples_contributed", source);
    samples_dropped_ = meta_field<int64_t>(meta, "samples_dropped", source);
    record_.local_step = meta_field<int64_t>(meta, "local_step", source);
    accumulation_ = swarm_tensor(tensors, "swarm.accumulation");
    outer_start_ = swarm_tensor(tensors, "swarm.outer_start");
    outer_momentum_ = swarm_tensor(tensors, "swarm.outer_momentum");
    residual_ = swarm_tensor(tensors, "swarm.residual");
    factors_ = swarm_tensor(tensors, "swarm.factors");
  }
  if (config_.swarm.sync == "batch") {
    step.set_outer_reduction(
        [this](const std::vector<at::Tensor>& gradients, int64_t samples) { return reduce(gradients, samples); });
    install_leaf_hooks();
  } else if (!outer_start_.defined()) {
    outer_start_ = flatten_float(holder_->master_parameters()).clone();
    outer_momentum_ = at::zeros_like(outer_start_);
  }
  if (config_.swarm.pseudo_gradient_rank > 0) {
    std::vector<std::vector<int64_t>> shapes;
    for (const at::Tensor& p : holder_->master_parameters()) shapes.push_back(p.sizes().vec());
    low_rank_ = std::make_unique<LowRankPseudoGradients>(shapes, config_.swarm.pseudo_gradient_rank);
    if (!factors_.defined()) factors_ = low_rank_->initial_factors();
    require(factors_.numel() == low_rank_->factors_numel(), "the checkpoint's swarm.factors holds ", factors_.numel(),
            " entries where swarm.pseudo_gradient_rank = ", config_.swarm.pseudo_gradient_rank, " needs ",
            low_rank_->factors_numel());
  }
  if ((encoding_.sparse || low_rank_) && !residual_.defined()) residual_ = at::zeros_like(outer_start_);
  require(!residual_.defined() || residual_.numel() == outer_start_.numel(),
          "the checkpoint's swarm.residual holds ", residual_.numel(), " entries where the model has ",
          outer_start_.numel());
  publish();
  // Wait to see swarm.min_peers live peers (this one included) before the first step. A peer
  // pointed at a swarm (--initial-peer) waits to see at least one other: taking its first look
  // before its DHT node had the swarm's records, it would train alone, split off (hivemind #624),
  // as would a peer with another key, which sees none. Not within swarm.join_timeout_s: it fails.
  const bool joining = !identity_.initial_peers.empty();
  const int64_t need = joining ? std::max<int64_t>(config_.swarm.min_peers, 2) : config_.swarm.min_peers;
  const Deadline join = Deadline::in(config_.swarm.join_timeout_s);
  if (!joining && need == 1)
    say("swarm.min_peers = 1: this peer starts at once and takes the swarm's rounds alone until others join "
        "(they then take its state); to start several peers together, set swarm.min_peers to their number");
  for (int64_t seen = 0;;) {
    const std::vector<PeerRecord> live = membership_->live_peers(1.0);
    if (static_cast<int64_t>(live.size()) != seen) {
      seen = static_cast<int64_t>(live.size());
      say(std::to_string(seen) + " live peer(s) in swarm '" + identity_.swarm + "' (this one is " + identity_.id +
          " at " + identity_.listen + ")");
    }
    if (seen >= need) break;
    if (joining && seen < 2 && join.seconds_left() <= 0) {
      std::string from;
      for (const std::string& a : identity_.initial_peers) from += (from.empty() ? "" : ", ") + a;
      fail("peer ", identity_.id, ": no other live peer of swarm '", identity_.swarm, "' seen through --initial-peer ",
           from, " within swarm.join_timeout_s = ", config_.swarm.join_timeout_s, " s (is a peer live there, in swarm '",
           identity_.swarm, "', with the same swarm.key_file? A peer with another key sees none)");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  // A late joiner, or a restart that missed rounds, catches up with the peers ahead (catch_up); a
  // failed try (a donor gone meanwhile) is retried with the peers then ahead, within
  // swarm.join_timeout_s. The messages of this phase reach the log only once training starts, so
  // the failure carries the last reason itself.
  for (const Deadline give_up = Deadline::in(config_.swarm.join_timeout_s);;) {
    const std::vector<PeerRecord> ahead = peers_ahead();
    if (ahead.empty()) break;
    if (const std::optional<int64_t> loaded = catch_up(step, ahead, give_up)) {
      step_number = *loaded;
      break;
    }
    require(give_up.seconds_left() > 0, "peer ", identity_.id, ": could not take the swarm's state from the ",
            ahead.size(), " peer(s) ahead within swarm.join_timeout_s = ", config_.swarm.join_timeout_s,
            " s; the last try: ", transfer_error_);
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  refresh_state_digest();
  step_started_ = unix_now();
  return step_number;
}

std::vector<RoundMember> Swarm::candidates(const std::vector<PeerRecord>& live) const {
  std::vector<RoundMember> out = {{identity_.id, identity_.listen}};
  for (const PeerRecord& r : live)
    if (r.id != identity_.id && r.swarm_step == swarm_step_ && same_state(r)) out.push_back({r.id, r.address});
  return out;
}

// A checkpoint's or snapshot's tensor `name` as float32, or undefined when absent.
at::Tensor Swarm::swarm_tensor(const std::map<std::string, at::Tensor>& tensors, const std::string& name) {
  const auto it = tensors.find(name);
  return it == tensors.end() ? at::Tensor() : it->second.to(at::kFloat).clone();
}

nlohmann::json Swarm::metrics() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return {{"swarm_step", swarm_step_},
          {"rounds", rounds_},
          {"failed_rounds", failed_rounds_},
          {"bytes_sent", bytes_sent_},
          {"bytes_received", bytes_received_},
          {"samples_processed", samples_processed_},
          {"samples_contributed", samples_contributed_},
          {"samples_dropped", samples_dropped_},
          {"samples_accumulated", accumulated_},
          {"outliers", outliers_},
          {"overlapped_rounds", overlapped_rounds_},
          {"ring_rounds", ring_rounds_},
          {"overlap_followed", overlap_followed_},
          {"state_digest", current_state()},
          {"state_divergences", state_divergences_},
          {"suspects", record_.suspects},
          {"round_times", round_times_}};
}

nlohmann::json Swarm::checkpoint_state() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return {{"swarm", identity_.swarm},
          {"id", identity_.id},
          {"sync", config_.swarm.sync},
          {"swarm_step", swarm_step_},
          {"local_step", record_.local_step},
          {"accumulated_samples", accumulated_},
          {"inner_steps_done", inner_},
          {"samples_processed", samples_processed_},
          {"samples_contributed", samples_contributed_},
          {"samples_dropped", samples_dropped_}};
}

NamedTensors Swarm::checkpoint_tensors() const {
  NamedTensors out;
  if (accumulation_.defined()) out.emplace_back("swarm.accumulation", accumulation_.clone());
  if (outer_start_.defined()) out.emplace_back("swarm.outer_start", outer_start_.clone());
  if (outer_momentum_.defined()) out.emplace_back("swarm.outer_momentum", outer_momentum_.clone());
  if (residual_.defined()) out.emplace_back("swarm.residual", residual_.clone());
  if (factors_.defined()) out.emplace_back("swarm.factors", factors_.clone());
  return out;
}

}  // namespace tessera::atom
