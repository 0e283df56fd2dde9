// A peer behind the swarm catches up (swarm.h): by replaying the rounds it missed from the peers'
// logs, or by taking the state of a peer ahead of it.
#include "atom/swarm.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <sstream>
#include <utility>

#include <ATen/ATen.h>

#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors.h"
#include "core/byte_size.h"
#include "core/error.h"
#include "core/flat_tensors.h"

namespace tessera::atom {

std::optional<int64_t> Swarm::catch_up(TrainStep& step, const std::vector<PeerRecord>& ahead, Deadline deadline) {
  // Rounds replay onto the swarm's state only: not onto a replica that diverged at this step.
  const bool all_ahead =
      std::all_of(ahead.begin(), ahead.end(), [&](const PeerRecord& r) { return r.swarm_step > swarm_step_; });
  std::optional<int64_t> loaded;
  if (config_.swarm.sync == "batch" && holds_swarm_state_ && all_ahead && replay(ahead, deadline))
    loaded = swarm_step_;
  else
    loaded = load_state(step, ahead, deadline);
  if (loaded) refresh_state_digest();
  return loaded;
}

void Swarm::refresh_state_digest() {
  if (!holds_swarm_state_) return;
  const std::string digest = tensors_digest(config_.swarm.sync == "batch" ? holder_->master_parameters()
                                                                          : std::vector<at::Tensor>{outer_start_});
  {
    std::lock_guard<std::mutex> lock(mutex_);
    state_digest_ = digest;
    digest_step_ = swarm_step_;
  }
  averager_->set_state(swarm_step_, digest);
  publish();
}

std::string Swarm::current_state() const { return digest_step_ == swarm_step_ ? state_digest_ : ""; }

bool Swarm::same_state(const PeerRecord& r) const {
  const std::string mine = current_state();
  return r.state.empty() || mine.empty() || r.state == mine;
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
    unflatten_into(mean, holder_->final_gradients());
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

std::vector<PeerRecord> Swarm::ahead_of(const std::vector<PeerRecord>& live) {
  std::vector<PeerRecord> ahead;
  for (const PeerRecord& r : live)
    if (r.id != identity_.id && r.swarm_step > swarm_step_) ahead.push_back(r);
  if (!ahead.empty() || digest_step_ != swarm_step_) return ahead;
  // The state most peers at this swarm step hold (this one counted for its own), the smallest
  // digest among equals (the map's order, and only a larger count replaces the first found);
  // undecided while a peer's digest at this step is unknown (its update still running), which
  // could tip a count.
  std::map<std::string, std::vector<PeerRecord>> holders = {{state_digest_, {}}};  // the others, by digest
  size_t peers = 1, most = 0;
  for (const PeerRecord& r : live)
    if (r.id != identity_.id && r.swarm_step == swarm_step_) {
      if (r.state.empty()) return ahead;
      holders[r.state].push_back(r);
      ++peers;
    }
  std::string swarms;
  for (const auto& [digest, others] : holders)
    if (const size_t n = others.size() + (digest == state_digest_ ? 1 : 0); n > most) {
      most = n;
      swarms = digest;
    }
  if (swarms == state_digest_) return ahead;
  if (diverged_step_ != swarm_step_) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ++state_divergences_;
      diverged_step_ = swarm_step_;
    }
    say("swarm step " + std::to_string(swarm_step_) + ": this peer's state (digest " + state_digest_ +
        ") is not the one " + std::to_string(most) + " of the " + std::to_string(peers) +
        " live peers at this step hold (" + swarms +
        "): its replica diverged (rounds taken apart from the others, or a corrupted update); taking theirs");
  }
  return holders[swarms];
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
    outer_start_ = swarm_tensor(contents.tensors, "swarm.outer_start");
    outer_momentum_ = swarm_tensor(contents.tensors, "swarm.outer_momentum");
    require(outer_start_.defined() && outer_momentum_.defined(), d.path, ": a DiLoCo state without its outer tensors");
  }
  if (low_rank_) {
    factors_ = swarm_tensor(contents.tensors, "swarm.factors");
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
  line << "took the swarm's state at swarm step " << d.swarm_step << " (" << format_bytes(static_cast<double>(d.bytes))
       << ") from " << d.donors.size() << " donor(s)";
  if (dropped > 0) line << "; dropped " << dropped << " samples accumulated on the old parameters";
  say(line.str());
  publish();
  // The loop's step: the swarm's in batch mode, its local steps under DiLoCo.
  return config_.swarm.sync == "batch" ? d.swarm_step : d.swarm_step * config_.swarm.inner_steps;
}

}  // namespace tessera::atom
