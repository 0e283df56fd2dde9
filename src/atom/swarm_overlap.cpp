// Overlapped batch rounds (swarm.h, swarm.overlap_rounds): the round a local step will close starts
// when that step starts, and each parameter's share of the contribution goes out once the step's
// last backward has made its gradient final.
//
// The contribution is computed as reduce_after_step computes it, parameter by parameter with the
// same operation (outgoing = accumulation + gradient x samples, one add per parameter), so the
// round sums the same numbers; only when they travel changes. A share is marked final only once it
// is read back finite (a step whose gradients are not finite is not contributed, as after the
// backward). The round's thread reads a range of `outgoing` only once the hooks (training thread,
// or autograd's device thread) marked it final.
#include <iomanip>
#include <numeric>
#include <sstream>

#include <ATen/ATen.h>

#include "atom/swarm.h"
#include "core/error.h"
#include "core/flat_tensors.h"
#include "core/gradient_ready_hook.h"

namespace tessera::atom {

void Swarm::install_leaf_hooks() {
  leaves_ = holder_->gradient_leaves();
  if (config_.swarm.overlap_rounds == "never" || leaves_.empty()) {
    leaves_.clear();
    return;
  }
  leaf_hooks_ = std::make_shared<LeafHooks>();
  leaf_hooks_->swarm = this;
  int64_t offset = 0;
  for (size_t i = 0; i < leaves_.size(); ++i) {
    leaf_offsets_.push_back(offset);
    offset += leaves_[i].numel();
    set_gradient_ready_hook(leaves_[i], [hooks = leaf_hooks_, i] {
      if (Swarm* swarm = hooks->swarm.load()) swarm->leaf_gradient_final(i);
    });
  }
  leaf_offsets_.push_back(offset);
}

bool Swarm::probing(int64_t step) {
  return step >= kFirstProbe && (step - kFirstProbe) % kReprobeAfter < kProbeRounds;
}

bool Swarm::overlap_round(int64_t step) const {
  if (config_.swarm.overlap_rounds != "auto") return true;
  return probing(step) ? step % 2 == 0 : overlap_followed_;
}

void Swarm::time_round() {
  if (config_.swarm.overlap_rounds != "auto") return;
  const double now = unix_now();
  const int64_t taken = swarm_step_ - 1;  // the round just taken
  // Its period: from the round before, when that was the step before (a peer behind, a failed
  // round or a joiner's first round has none).
  if (probing(taken) && last_round_step_ == taken - 1)
    probe_periods_[overlap_round(taken) ? 1 : 0].push_back(now - last_round_end_);
  last_round_end_ = now;
  last_round_step_ = taken;
  if (!probing(taken) || probing(taken + 1)) return;
  // The probe's last round: the faster way, when both were timed (else the preference stands).
  const std::vector<double>& after = probe_periods_[0];
  const std::vector<double>& with = probe_periods_[1];
  if (!after.empty() && !with.empty()) {
    const auto mean = [](const std::vector<double>& v) {
      return std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
    };
    const double overlapped_s = mean(with), after_s = mean(after);
    overlap_preferred_ = overlapped_s < after_s ? 1 : 0;
    std::ostringstream line;
    line << std::setprecision(3) << "timed rounds " << overlapped_s << " s a round overlapped, " << after_s
         << " s after the backward (rounds " << taken - kProbeRounds + 2 << "-" << taken + 1
         << "): hosting a round, this peer tells its group to "
         << (overlap_preferred_ ? "overlap" : "start after the backward") << " (swarm.overlap_rounds = auto)";
    say(line.str());
    tell_hosted_groups();
  }
  probe_periods_[0].clear();
  probe_periods_[1].clear();
}

void Swarm::follow_host(const RoundResult& result) {
  if (config_.swarm.overlap_rounds != "auto" || result.overlap_choice < 0) return;
  const bool overlap = result.overlap_choice == 1;
  if (overlap != overlap_followed_)
    say(std::string("rounds ") + (overlap ? "overlap the local step" : "start after the backward") +
        " from swarm step " + std::to_string(swarm_step_ + 1) + ": the round's host (" + result.members.front().id +
        ") told its group so (swarm.overlap_rounds = auto)");
  overlap_followed_ = overlap;
  tell_hosted_groups();
}

void Swarm::tell_hosted_groups() {
  if (config_.swarm.overlap_rounds != "auto") return;
  averager_->set_overlap_choice(overlap_preferred_ >= 0 ? overlap_preferred_ : overlap_followed_ ? 1 : 0);
}

void Swarm::start_overlapped_round() {
  if (leaves_.empty() || behind_ || poison_ || leaving_ || swarm_step_ >= config_.train.steps ||
      !overlap_round(swarm_step_))
    return;
  // The same count as a step's end takes (reduce_after_step), with this step's samples claimed:
  // the others' records as this peer's node has them now (a round's members at their new step:
  // Membership::saw_round).
  const std::vector<PeerRecord> live = membership_->live_peers(0);
  if (!ahead_of(live).empty()) return;
  const int64_t samples = config_.train.batch_size * config_.train.grad_accum;
  if (swarm_samples(live, accumulated_ + samples) < config_.swarm.target_batch_size) return;
  auto o = std::make_unique<OverlappedRound>();
  o->swarm_step = swarm_step_;
  o->samples = samples;
  o->decided = unix_now();
  o->outgoing = at::empty_like(accumulation_);
  o->progress = std::make_shared<ContributionProgress>(accumulation_.numel());
  o->arrivals.assign(leaves_.size(), 0);
  o->done.assign(leaves_.size(), 0);
  OverlappedRound* round = o.get();
  const double weight = static_cast<double>(accumulated_ + samples);
  round->thread = std::thread([this, round, members = candidates(live), weight] {
    try {
      round->result = averager_->run_round(round->swarm_step, members, round->outgoing, weight, encoding_, clock_,
                                           round->progress);
    } catch (const std::exception& e) {
      round->error = e.what();
    }
  });
  overlapped_ = std::move(o);
}

bool Swarm::add_share(OverlappedRound& o, size_t leaf, const at::Tensor& gradient) {
  at::NoGradGuard no_grad;
  const int64_t b = leaf_offsets_[leaf], n = leaf_offsets_[leaf + 1] - b;
  at::Tensor out = o.outgoing.narrow(0, b, n);
  at::add_out(out, accumulation_.narrow(0, b, n), gradient.detach().reshape(-1), static_cast<double>(o.samples));
  o.done[leaf] = 1;
  // Read back on the device's stream, so that the round's thread reads what this add wrote.
  return all_finite(out);
}

void Swarm::leaf_gradient_final(size_t leaf) {
  OverlappedRound* o = overlapped_.get();
  if (!o || o->done[leaf] || ++o->arrivals[leaf] < config_.train.grad_accum) return;
  const at::Tensor g = leaves_[leaf].grad();
  if (!g.defined()) return;  // the step's end counts it (as zeros)
  if (add_share(*o, leaf, g)) {
    o->progress->mark_final(leaf_offsets_[leaf], leaf_offsets_[leaf + 1]);
  } else {
    o->progress->withdraw("local step " + std::to_string(record_.local_step + 1) + "'s gradient of parameter " +
                          std::to_string(leaf) + " is not finite");
  }
}

bool Swarm::finish_overlapped_round(const std::vector<at::Tensor>& gradients, int64_t samples, double entered) {
  std::unique_ptr<OverlappedRound> o = std::move(overlapped_);
  require(samples == o->samples, "internal: a local step of ", samples, " samples where its round counted on ",
          o->samples, " (train.batch_size x train.grad_accum)");
  // Every gradient is final now: the shares no hook gave (a parameter without a gradient in this
  // step has zeros in `gradients`), each checked as the hooks check theirs. The step contributes
  // when all are finite (a hook that found one that is not withdrew the contribution already).
  bool contributed = o->progress->withdrawn().empty();
  for (size_t i = 0; i < leaves_.size(); ++i)
    if (!o->done[i]) contributed = add_share(*o, i, gradients[i]) && contributed;
  if (contributed)
    o->progress->mark_all_final();
  else
    o->progress->withdraw("local step " + std::to_string(record_.local_step) + "'s gradients are not finite");
  o->thread.join();
  count_step(samples, contributed);
  if (!o->error.empty()) {
    ++failed_rounds_;
    if (contributed) accumulation_ = o->outgoing;  // the step's share kept, with the rest
    say(o->error + " (the accumulated gradients are kept; retried after the next local step)");
    return false;
  }
  // A withdrawn contribution never completes its round: a piece goes out only once final.
  require(contributed, "internal: a round completed with a contribution this peer withdrew");
  take_round(o->result, gradients, entered, o->decided, true);
  ++overlapped_rounds_;
  return true;
}

void Swarm::cancel_overlapped_round(const std::string& why) {
  if (!overlapped_) return;
  overlapped_->progress->withdraw(why);
  overlapped_->thread.join();
  overlapped_.reset();
}

}  // namespace tessera::atom
