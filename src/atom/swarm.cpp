// One peer's swarm: identity, record publishing, batch-mode rounds and DiLoCo outer steps (swarm.h).
#include "atom/swarm.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <sstream>
#include <utility>

#include <torch/torch.h>

#include "core/error.h"
#include "core/fs.h"
#include "core/json_file.h"
#include "checkpoint/checkpoint.h"
#include "core/splitmix.h"
#include "checkpoint/safetensors.h"
#include "optim/optim_options.h"

namespace tessera::atom {
namespace {

std::string megabytes(uint64_t bytes) {
  std::ostringstream out;
  out.precision(3);
  out << static_cast<double>(bytes) / 1e6 << " MB";
  return out.str();
}

at::Tensor flatten(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> flat;
  for (const at::Tensor& t : tensors) flat.push_back(t.detach().reshape(-1).to(at::kFloat));
  return at::cat(flat);
}

// flat += alpha x (tensors, each its run of elements in order), without a flat copy of them.
void add_flat(at::Tensor& flat, const std::vector<at::Tensor>& tensors, double alpha) {
  at::NoGradGuard no_grad;
  int64_t offset = 0;
  for (const at::Tensor& t : tensors) {
    flat.narrow(0, offset, t.numel()).add_(t.detach().reshape(-1), alpha);
    offset += t.numel();
  }
}

// A checkpoint's or snapshot's tensor `name` as float32, or undefined when absent.
at::Tensor float_copy(const std::map<std::string, at::Tensor>& tensors, const std::string& name) {
  const auto it = tensors.find(name);
  return it == tensors.end() ? at::Tensor() : it->second.to(at::kFloat).clone();
}

// Writes `flat` back into `tensors`, each its run of elements in order.
void scatter(const at::Tensor& flat, const std::vector<at::Tensor>& tensors) {
  at::NoGradGuard no_grad;
  int64_t offset = 0;
  for (const at::Tensor& t : tensors) {
    const_cast<at::Tensor&>(t).copy_(flat.narrow(0, offset, t.numel()).view(t.sizes()));
    offset += t.numel();
  }
}

}  // namespace

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
  averager_ = std::make_unique<Averager>(key_, identity_.id, identity_.listen, max_bytes);
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
  if (publisher_.joinable()) publisher_.join();
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
    record_.time = unix_now();
    r = record_;
  }
  membership_->publish(r);
}

void Swarm::serve(std::unique_ptr<Channel> channel) {
  const Message first = channel->receive(Deadline::in(30));
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
    accumulation_ = float_copy(tensors, "swarm.accumulation");
    outer_start_ = float_copy(tensors, "swarm.outer_start");
    outer_momentum_ = float_copy(tensors, "swarm.outer_momentum");
    residual_ = float_copy(tensors, "swarm.residual");
    factors_ = float_copy(tensors, "swarm.factors");
  }
  if (config_.swarm.sync == "batch") {
    step.set_outer_reduction(
        [this](const std::vector<at::Tensor>& gradients, int64_t samples) { return reduce(gradients, samples); });
  } else if (!outer_start_.defined()) {
    outer_start_ = flatten(holder_->master_parameters()).clone();
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
  step_started_ = unix_now();
  return step_number;
}

std::vector<RoundMember> Swarm::candidates(const std::vector<PeerRecord>& live) const {
  std::vector<RoundMember> out = {{identity_.id, identity_.listen}};
  for (const PeerRecord& r : live)
    if (r.id != identity_.id && r.swarm_step == swarm_step_) out.push_back({r.id, r.address});
  return out;
}

std::optional<int64_t> Swarm::after_local_step(TrainStep& step, int64_t samples, double loss, double seconds) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    samples_processed_ += samples;
    ++record_.local_step;
    record_.loss = loss;
    record_.samples_per_s = seconds > 0 ? static_cast<double>(samples) / seconds : 0;
  }
  if (!behind_) return std::nullopt;
  behind_ = false;
  const std::vector<PeerRecord> ahead = peers_ahead();
  if (ahead.empty()) return std::nullopt;
  const std::optional<int64_t> loaded = catch_up(step, ahead, Deadline::in(config_.swarm.round_timeout_max_s));
  behind_ = !loaded;  // a failed try is retried after the next local step
  return loaded;
}

std::optional<int64_t> Swarm::catch_up(TrainStep& step, const std::vector<PeerRecord>& ahead, Deadline deadline) {
  if (config_.swarm.sync == "batch" && holds_swarm_state_ && replay(ahead, deadline)) return swarm_step_;
  return load_state(step, ahead, deadline);
}

bool Swarm::replay(const std::vector<PeerRecord>& ahead, Deadline deadline) {
  int64_t target = swarm_step_, numel = 0;
  for (const PeerRecord& r : ahead) target = std::max(target, r.swarm_step);
  for (const at::Tensor& p : holder_->master_parameters()) numel += p.numel();
  const int64_t from = swarm_step_;
  std::string missing;
  while (swarm_step_ < target) {
    at::Tensor mean;
    for (const PeerRecord& donor : ahead) {
      if (donor.swarm_step <= swarm_step_) continue;
      try {
        mean = fetch_round(donor.address, key_, identity_.id, swarm_step_, numel,
                           static_cast<size_t>(config_.swarm.max_message_mb * 1e6), deadline);
      } catch (const std::exception& e) {
        missing += std::string(missing.empty() ? "" : "; ") + e.what();
        continue;
      }
      if (mean.defined()) break;
    }
    if (!mean.defined()) break;
    if (swarm_step_ == from) drop_accumulated();  // gathered on parameters the first replayed round replaces
    scatter(mean, holder_->final_gradients());
    holder_->apply_written_gradients(learning_rate(config_.optim, swarm_step_, config_.train.steps),
                                     config_.optim.grad_clip);
    round_log_->add(swarm_step_, mean);  // so that this peer serves it in turn
    std::lock_guard<std::mutex> lock(mutex_);
    ++swarm_step_;
  }
  if (swarm_step_ > from) {
    say("replayed rounds " + std::to_string(from) + " to " + std::to_string(swarm_step_ - 1) +
        " from the peers' logs (" + std::to_string(swarm_step_ - from) + " round(s))");
    publish();
  }
  if (swarm_step_ < target)
    say("no peer ahead holds round " + std::to_string(swarm_step_) + " in its log (swarm.replay_mb)" +
        (missing.empty() ? std::string() : ": " + missing) + "; taking the swarm's state instead");
  return swarm_step_ >= target;
}

void Swarm::drop_accumulated() {
  if (accumulation_.defined()) accumulation_.zero_();
  if (residual_.defined()) residual_.zero_();  // what was left unsent was progress on the old parameters
  std::lock_guard<std::mutex> lock(mutex_);
  samples_dropped_ += accumulated_;
  accumulated_ = 0;
  inner_ = 0;
}

std::vector<PeerRecord> Swarm::ahead_of(const std::vector<PeerRecord>& live) const {
  std::vector<PeerRecord> ahead;
  for (const PeerRecord& r : live)
    if (r.id != identity_.id && r.swarm_step > swarm_step_) ahead.push_back(r);
  return ahead;
}

std::vector<PeerRecord> Swarm::peers_ahead() { return ahead_of(membership_->live_peers(1.0)); }

NamedTensors Swarm::snapshot_tensors(TrainStep& step) {
  NamedTensors out;
  for (auto& [name, t] : step.model_state()) out.emplace_back("model." + name, t);
  // Under DiLoCo each peer's inner optimizer state is its own (its data differ): the snapshot
  // holds what the peers share, so theirs are the same bytes and a joiner takes it from all.
  if (config_.swarm.sync == "batch")
    for (auto& entry : step.training_state()) out.push_back(std::move(entry));
  if (outer_start_.defined()) {
    out.emplace_back("swarm.outer_start", outer_start_);
    out.emplace_back("swarm.outer_momentum", outer_momentum_);
  }
  if (factors_.defined()) out.emplace_back("swarm.factors", factors_);
  return out;
}

std::optional<int64_t> Swarm::load_state(TrainStep& step, const std::vector<PeerRecord>& ahead, Deadline deadline) {
  // A snapshot holds the state this peer holds (same model and optimizer): twice its tensors' bytes
  // and a megabyte of header bound what a donor may offer.
  int64_t own_bytes = 1 << 20;
  for (const auto& [name, t] : snapshot_tensors(step)) own_bytes += t.numel() * static_cast<int64_t>(t.element_size());
  Download d;
  try {
    d = download_state(ahead, key_, identity_.id, identity_.run_dir + "/swarm_state",
                       static_cast<size_t>(config_.swarm.max_message_mb * 1e6), 2 * own_bytes, deadline);
  } catch (const std::exception& e) {
    transfer_error_ = e.what();
    say(std::string("taking the swarm's state failed: ") + e.what() + " (retried)");
    return std::nullopt;
  }
  const SafetensorsContents contents = read_safetensors(d.path);
  std::map<std::string, at::Tensor> model, training;
  for (const auto& [name, t] : contents.tensors) {
    if (name.rfind("model.", 0) == 0) model.emplace(name.substr(6), t);
    else if (name.rfind("swarm.", 0) != 0) training.emplace(name, t);
  }
  step.load_model_state(model_reader(model, d.path));
  if (config_.swarm.sync == "batch") step.load_training_state(training, d.path);
  if (config_.swarm.sync == "diloco") {
    outer_start_ = float_copy(contents.tensors, "swarm.outer_start");
    outer_momentum_ = float_copy(contents.tensors, "swarm.outer_momentum");
    require(outer_start_.defined() && outer_momentum_.defined(), d.path, ": a DiLoCo state without its outer tensors");
  }
  if (low_rank_) {
    factors_ = float_copy(contents.tensors, "swarm.factors");
    require(factors_.defined() && factors_.numel() == low_rank_->factors_numel(), d.path,
            ": a state without the low-rank factors swarm.pseudo_gradient_rank = ", config_.swarm.pseudo_gradient_rank,
            " needs (does the swarm run another rank?)");
  }
  const int64_t dropped = accumulated_;
  drop_accumulated();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    swarm_step_ = d.swarm_step;
    holds_swarm_state_ = true;
  }
  std::filesystem::remove(d.path);
  std::ostringstream line;
  line << "took the swarm's state at swarm step " << d.swarm_step << " (" << megabytes(static_cast<uint64_t>(d.bytes))
       << ") from " << d.donors.size() << " donor(s)";
  if (dropped > 0) line << "; dropped " << dropped << " samples accumulated on the old parameters";
  say(line.str());
  publish();
  // The loop's step: the swarm's in batch mode, its local steps under DiLoCo.
  return config_.swarm.sync == "batch" ? d.swarm_step : d.swarm_step * config_.swarm.inner_steps;
}

bool Swarm::reduce(const std::vector<at::Tensor>& gradients, int64_t samples) {
  if (!accumulation_.defined()) {
    int64_t numel = 0;
    for (const at::Tensor& g : gradients) numel += g.numel();
    accumulation_ = at::zeros({numel}, gradients.front().options().dtype(at::kFloat));
  }
  // A step whose gradients are not finite (an fp16 overflow; its owner lowers the loss scale) is
  // not contributed: one peer's inf would be every peer's round mean.
  std::vector<at::Tensor> finite;
  for (const at::Tensor& g : gradients) finite.push_back(at::isfinite(g).all());
  const bool contributed = at::stack(finite).all().item<bool>();
  if (contributed) {
    add_flat(accumulation_, gradients, static_cast<double>(samples));
  } else {
    say("local step " + std::to_string(record_.local_step) + ": its gradients are not finite, so its " +
        std::to_string(samples) + " samples are not contributed");
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!contributed) samples_dropped_ += std::exchange(samples, 0);
    accumulated_ += samples;
    record_.claimed = samples;
  }
  publish();
  // The swarm's samples at this step: this peer's accumulated, the others' accumulated and claimed.
  // Only records published since this local step began show what the others have run meanwhile
  // (each republishes at every local step's end and every publish interval): wait for them, at
  // most one publish interval and a little (a dead peer's never comes).
  std::vector<PeerRecord> live;
  for (const Deadline fresh = Deadline::in(config_.swarm.publish_interval_s + 0.1);;) {
    live = membership_->live_peers(0.5);
    const bool stale = std::any_of(live.begin(), live.end(), [&](const PeerRecord& r) {
      return r.id != identity_.id && r.time < step_started_;
    });
    if (!stale || fresh.seconds_left() <= 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  int64_t total = accumulated_;
  for (const PeerRecord& r : live)
    if (r.id != identity_.id && r.swarm_step == swarm_step_) total += r.samples + r.claimed;
  step_started_ = unix_now();  // the next local step begins when this returns
  if (!ahead_of(live).empty()) {
    behind_ = true;  // after_local_step downloads their state
    return false;
  }
  if (total < config_.swarm.target_batch_size) return false;
  RoundResult result;
  try {
    result = averager_->run_round(swarm_step_, candidates(live), accumulation_,
                                  static_cast<double>(accumulated_), encoding_, clock_);
  } catch (const RoundError& e) {
    ++failed_rounds_;
    say(std::string(e.what()) + " (the accumulated gradients are kept; retried after the next local step)");
    return false;
  }
  const at::Tensor mean = result.sum / result.weight;
  round_log_->add(swarm_step_, mean);
  scatter(mean, gradients);
  holder_->gradients_written();
  accumulation_.zero_();
  step_started_ = unix_now();
  finish_round(result, "round", std::to_string(static_cast<int64_t>(result.weight)) + " samples, ");
  return true;
}

void Swarm::finish_round(const RoundResult& result, const std::string& what, const std::string& detail) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    samples_contributed_ += accumulated_;
    accumulated_ = 0;
    inner_ = 0;
    ++swarm_step_;
    ++rounds_;
    holds_swarm_state_ = true;
    bytes_sent_ += result.bytes_sent;
    bytes_received_ += result.bytes_received;
  }
  std::vector<std::string> members;
  for (const RoundMember& m : result.members) members.push_back(m.id);
  membership_->saw_round(members, swarm_step_);
  std::ostringstream line;
  line << what << " " << swarm_step_ << ": " << result.members.size() << " peers, " << detail << "sent "
       << megabytes(result.bytes_sent) << " in " << result.seconds << " s";
  say(line.str());
  publish();
}

void Swarm::after_update(TrainStep& step, int64_t step_number) {
  if (config_.swarm.sync == "batch") {
    if (snapshots_->wanted(swarm_step_)) snapshots_->write(swarm_step_, snapshot_tensors(step));
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++inner_;
    accumulated_ += record_.claimed;
  }
  if (inner_ >= config_.swarm.inner_steps) outer_step(step);
}

void Swarm::outer_step(TrainStep& step) {
  // A peer behind the swarm (its download was overtaken, it missed a round) takes no outer step
  // on its own, which would give it another state under the swarm's step numbers: it takes the
  // swarm's state after its next local step (after_local_step), as in batch mode.
  const std::vector<PeerRecord> live = membership_->live_peers(0.5);
  if (!ahead_of(live).empty()) {
    behind_ = true;
    return;
  }
  const std::vector<at::Tensor> masters = holder_->master_parameters();
  // With top-k or a rank, what earlier rounds left unsent joins this pseudo-gradient (error
  // feedback), decayed by swarm.error_feedback_decay.
  at::Tensor pseudo_gradient = outer_start_ - flatten(masters);
  if (residual_.defined()) pseudo_gradient.add_(residual_, config_.swarm.error_feedback_decay);
  // With a rank, the round carries this swarm step's side of each matrix's factor product.
  const at::Tensor contribution =
      low_rank_ ? low_rank_->encode(pseudo_gradient, factors_, swarm_step_) : pseudo_gradient;
  RoundResult result;
  try {
    result = averager_->run_round(swarm_step_, candidates(live), contribution, 1.0, encoding_, clock_);
  } catch (const RoundError& e) {
    ++failed_rounds_;
    say(std::string(e.what()) + " (the local steps go on; the outer step is retried after the next one)");
    return;
  }
  at::Tensor g = result.sum / result.weight;
  if (low_rank_) {
    residual_ = pseudo_gradient - low_rank_->decode(result.delivered, factors_, swarm_step_);
    const at::Tensor mean = g;
    g = low_rank_->decode(mean, factors_, swarm_step_);
    low_rank_->advance(factors_, mean, swarm_step_);
  } else if (residual_.defined()) {
    residual_ = pseudo_gradient - result.delivered;
  }
  // Outer Nesterov SGD from the last outer parameters (DiLoCo): v = mu v + g; p = p0 - lr (g + mu v).
  const double mu = config_.swarm.outer_momentum;
  outer_momentum_.mul_(mu).add_(g);
  outer_start_.sub_(g + mu * outer_momentum_, config_.swarm.outer_lr);
  scatter(outer_start_, masters);
  holder_->parameters_written();
  if (snapshots_->wanted(swarm_step_ + 1)) snapshots_->write(swarm_step_ + 1, snapshot_tensors(step));
  finish_round(result, "outer step", "");
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
          {"samples_accumulated", accumulated_}};
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
