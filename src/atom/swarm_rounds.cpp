// The swarm's steps (swarm.h): after each local step, a batch-mode round once the swarm's samples
// reach swarm.target_batch_size, or a DiLoCo outer step every swarm.inner_steps.
#include "atom/swarm.h"

#include <algorithm>
#include <chrono>
#include <iomanip>
#include <sstream>

#include <ATen/ATen.h>

#include "core/byte_size.h"
#include "core/error.h"
#include "core/flat_tensors.h"

namespace tessera::atom {
namespace {

// flat += alpha x (tensors, each its run of elements in order), without a flat copy of them.
void add_flat(at::Tensor& flat, const std::vector<at::Tensor>& tensors, double alpha) {
  at::NoGradGuard no_grad;
  int64_t offset = 0;
  for (const at::Tensor& t : tensors) {
    flat.narrow(0, offset, t.numel()).add_(t.detach().reshape(-1), alpha);
    offset += t.numel();
  }
}

std::string format_percent(double fraction) {
  std::ostringstream out;
  out << std::setprecision(3) << 100 * fraction << "%";
  return out.str();
}

}  // namespace

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

bool Swarm::reduce(const std::vector<at::Tensor>& gradients, int64_t samples) {
  const double entered = unix_now();
  if (!accumulation_.defined()) {
    int64_t numel = 0;
    for (const at::Tensor& g : gradients) numel += g.numel();
    accumulation_ = at::zeros({numel}, gradients.front().options().dtype(at::kFloat));
  }
  const bool updated = overlapped_ ? finish_overlapped_round(gradients, samples, entered)
                                   : reduce_after_step(gradients, samples, entered);
  if (updated) time_round();
  step_started_ = unix_now();  // the next local step begins when this returns
  start_overlapped_round();
  return updated;
}

int64_t Swarm::swarm_samples(const std::vector<PeerRecord>& live, int64_t own) const {
  int64_t total = own;
  for (const PeerRecord& r : live)
    if (r.id != identity_.id && r.swarm_step == swarm_step_ && same_state(r)) total += r.samples + r.claimed;
  return total;
}

void Swarm::count_step(int64_t samples, bool contributed) {
  if (!contributed)
    say("local step " + std::to_string(record_.local_step) + ": its gradients are not finite, so its " +
        std::to_string(samples) + " samples are not contributed");
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!contributed) samples_dropped_ += samples;
    accumulated_ += contributed ? samples : 0;
    record_.claimed = samples;
  }
  publish();
}

void Swarm::take_round(const RoundResult& result, const std::vector<at::Tensor>& gradients, double entered,
                       double claims_seen, bool overlapped) {
  note_round_times(result, entered, claims_seen, overlapped);
  follow_host(result);
  const at::Tensor mean = result.sum / result.weight;
  round_log_->add(swarm_step_, mean);
  unflatten_into(mean, gradients);
  holder_->gradients_written();
  accumulation_.zero_();
  finish_round(result, "round", std::to_string(static_cast<int64_t>(result.weight)) + " samples, ");
}

bool Swarm::reduce_after_step(const std::vector<at::Tensor>& gradients, int64_t samples, double entered) {
  // A step whose gradients are not finite (an fp16 overflow; its owner lowers the loss scale) is
  // not contributed: one peer's inf would be every peer's round mean.
  const bool contributed = all_finite(gradients);
  if (contributed) add_flat(accumulation_, gradients, static_cast<double>(samples));
  count_step(samples, contributed);
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
  const double claims_seen = unix_now();
  const int64_t total = swarm_samples(live, accumulated_);
  if (!ahead_of(live).empty()) {
    behind_ = true;  // after_local_step downloads their state
    return false;
  }
  if (total < config_.swarm.target_batch_size) return false;
  RoundResult result;
  try {
    result = averager_->run_round(swarm_step_, candidates(live), sent(accumulation_),
                                  static_cast<double>(accumulated_), encoding_, clock_);
  } catch (const RoundError& e) {
    ++failed_rounds_;
    say(std::string(e.what()) + " (the accumulated gradients are kept; retried after the next local step)");
    return false;
  }
  take_round(result, gradients, entered, claims_seen, false);
  return true;
}

void Swarm::note_round_times(const RoundResult& result, double entered, double claims_seen, bool overlapped) {
  std::lock_guard<std::mutex> lock(mutex_);
  round_times_ = {{"swarm_step", swarm_step_ + 1}, {"overlapped", overlapped},   {"entered", entered},
                  {"claims_seen", claims_seen},    {"started", result.started}, {"grouped", result.grouped},
                  {"part_summed", result.part_summed}, {"finished", result.finished}};
}

at::Tensor Swarm::sent(const at::Tensor& contribution) {
  return poison_ ? poison_->apply(contribution) : contribution;
}

void Swarm::screen(const RoundResult& result) {
  if (result.screened.empty()) return;
  const bool clipped = config_.swarm.aggregation == "centered_clip";
  int64_t outliers = 0;
  std::ostringstream line;
  for (const Screening& s : result.screened) {
    std::deque<bool>& history = outlier_history_[s.member];
    history.push_back(s.outlier);
    if (history.size() > kScreenedRounds) history.pop_front();
    if (!s.outlier) continue;
    ++outliers;
    const auto m = std::find_if(result.members.begin(), result.members.end(),
                                [&](const RoundMember& r) { return r.id == s.member; });
    line << (outliers > 1 ? "; " : "") << "member " << s.member << " ("
         << (m != result.members.end() ? m->address : "?") << ") "
         << (clipped ? "clipped to " : "kept in ") << format_percent(s.kept)
         << (clipped ? " of its distance" : " of its entries");
  }
  if (outliers > 0)
    say("round " + std::to_string(swarm_step_ + 1) + " under " + config_.swarm.aggregation + ": " +
        std::to_string(outliers) + " outlier(s): " + line.str());
  std::vector<std::string> suspects;
  for (const auto& [member, history] : outlier_history_) {
    const auto count = std::count(history.begin(), history.end(), true);
    if (history.size() >= 3 && 2 * static_cast<size_t>(count) > history.size() && suspects.size() < kMaxSuspects)
      suspects.push_back(member);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  outliers_ = outliers;
  record_.suspects = suspects;
}

void Swarm::finish_round(const RoundResult& result, const std::string& what, const std::string& detail) {
  screen(result);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    samples_contributed_ += accumulated_;
    accumulated_ = 0;
    inner_ = 0;
    ++swarm_step_;
    ++rounds_;
    ring_rounds_ += result.ring;
    holds_swarm_state_ = true;
    bytes_sent_ += result.bytes_sent;
    bytes_received_ += result.bytes_received;
  }
  std::vector<std::string> members;
  for (const RoundMember& m : result.members) members.push_back(m.id);
  membership_->saw_round(members, swarm_step_);
  std::ostringstream line;
  line << what << " " << swarm_step_ << ": " << result.members.size() << " peers"
       << (result.ring ? " round a ring, " : ", ") << detail << "sent "
       << format_bytes(static_cast<double>(result.bytes_sent)) << " in " << result.seconds << " s";
  say(line.str());
  publish();
}

void Swarm::after_update(TrainStep& step, int64_t step_number) {
  if (config_.swarm.sync == "batch") {
    if (digest_step_ != swarm_step_ && poison_ && poison_->corrupt(holder_->master_parameters())) {
      holder_->parameters_written();
      say("TESSERA_SWARM_POISON=bitflip: one bit of a parameter flipped after round " + std::to_string(swarm_step_));
    }
    if (digest_step_ != swarm_step_) refresh_state_digest();
    if (snapshots_->wanted(swarm_step_)) snapshots_->write(swarm_step_, snapshot_tensors(step));
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++inner_;
    accumulated_ += record_.claimed;
  }
  if (inner_ >= config_.swarm.inner_steps) outer_step(step);
  if (digest_step_ != swarm_step_) refresh_state_digest();
}

void Swarm::outer_step(TrainStep& step) {
  // A peer behind the swarm (its download was overtaken, it missed a round) takes no outer step
  // on its own, which would give it another state under the swarm's step numbers: it takes the
  // swarm's state after its next local step (after_local_step), as in batch mode.
  const double entered = unix_now();
  const std::vector<PeerRecord> live = membership_->live_peers(0.5);
  if (!ahead_of(live).empty()) {
    behind_ = true;
    return;
  }
  const std::vector<at::Tensor> masters = holder_->master_parameters();
  // With top-k or a rank, what earlier rounds left unsent joins this pseudo-gradient (error
  // feedback), decayed by swarm.error_feedback_decay.
  at::Tensor pseudo_gradient = outer_start_ - flatten_float(masters);
  if (residual_.defined()) pseudo_gradient.add_(residual_, config_.swarm.error_feedback_decay);
  // With a rank, the round carries this swarm step's side of each matrix's factor product.
  const at::Tensor contribution =
      low_rank_ ? low_rank_->encode(pseudo_gradient, factors_, swarm_step_) : pseudo_gradient;
  RoundResult result;
  try {
    result = averager_->run_round(swarm_step_, candidates(live), sent(contribution), 1.0, encoding_, clock_);
  } catch (const RoundError& e) {
    ++failed_rounds_;
    say(std::string(e.what()) + " (the local steps go on; the outer step is retried after the next one)");
    return;
  }
  note_round_times(result, entered, entered, false);
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
  unflatten_into(outer_start_, masters);
  holder_->parameters_written();
  if (snapshots_->wanted(swarm_step_ + 1)) snapshots_->write(swarm_step_ + 1, snapshot_tensors(step));
  finish_round(result, "outer step", "");
}

}  // namespace tessera::atom
