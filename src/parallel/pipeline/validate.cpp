// Schedule validation (validate.h).
#include "parallel/pipeline/validate.h"

#include <sstream>
#include <tuple>

#include "core/error.h"
#include "parallel/pipeline/simulate.h"

namespace tessera::pipeline {
namespace {

std::string schedule_title(const Schedule& s) {
  std::ostringstream out;
  out << "pipeline schedule " << s.name << " (pp " << s.pp << ", " << s.v << " stage(s) per rank, " << s.micro_batches
      << " micro-batches)";
  return out.str();
}

[[noreturn]] void refuse(const Schedule& s, int64_t rank, int64_t index, const std::string& what) {
  const bool comm = index >= 0 && s.ranks[rank][index].is_transfer();
  fail(schedule_title(s), ": rank ", rank, ", action ", index >= 0 ? s.ranks[rank][index].str() : std::string("-"),
       " (position ", index, "): ", what, "\n", format_grid(s, !comm, rank, index));
}

// Where each compute and transfer action stands, (op, stage, micro) -> (rank, index), in a flat
// table (a search validates thousands of tables): the first eight ops of Op, every stage and
// micro-batch.
class Where {
 public:
  static constexpr int64_t kKinds = 8;  // F, B, I, W, SendF, RecvF, SendB, RecvB
  static_assert(static_cast<int64_t>(Op::RecvB) == kKinds - 1, "the transfers end Op's compute and transfer kinds");
  Where(int64_t stages, int64_t micro_batches)
      : stages_(stages), micro_(micro_batches), at_(static_cast<size_t>(kKinds * stages * micro_batches), {-1, -1}) {}
  // False when the action already has a place.
  bool emplace(const Action& a, int64_t rank, int64_t index) {
    auto& slot = at_[slot_of(a.op, a.stage, a.micro)];
    if (slot.first >= 0) return false;
    slot = {rank, index};
    return true;
  }
  std::pair<int64_t, int64_t> find(Op op, int64_t stage, int64_t micro) const {
    if (stage < 0 || stage >= stages_ || micro < 0 || micro >= micro_) return {-1, -1};
    return at_[slot_of(op, stage, micro)];
  }

 private:
  size_t slot_of(Op op, int64_t stage, int64_t micro) const {
    return static_cast<size_t>((static_cast<int64_t>(op) * stages_ + stage) * micro_ + micro);
  }
  int64_t stages_, micro_;
  std::vector<std::pair<int64_t, int64_t>> at_;
};

// GATHER/RELEASE bracket every compute action of a table that has them (holds counted per
// stage); OPTIM once per rank, last.
void check_parameter_actions(const Schedule& s) {
  bool gated = false;
  for (const auto& row : s.ranks)
    for (const Action& a : row) gated = gated || a.op == Op::Gather;
  int64_t stepping = 0, first_without = -1;
  for (int64_t r = 0; r < s.pp; ++r) {
    std::vector<int64_t> holds(static_cast<size_t>(s.stages()), 0);
    int64_t optim = -1;
    for (int64_t i = 0; i < static_cast<int64_t>(s.ranks[r].size()); ++i) {
      const Action& a = s.ranks[r][i];
      auto stage = [&] { return "stage " + std::to_string(a.stage); };
      if (a.op == Op::Gather) {
        holds[a.stage] += 1;
      } else if (a.op == Op::Release) {
        if (holds[a.stage] == 0) refuse(s, r, i, "releases " + stage() + ", which is not gathered");
        holds[a.stage] -= 1;
      } else if (a.op == Op::Optim) {
        if (optim >= 0) refuse(s, r, i, "a second optimizer step on this rank");
        optim = i;
      } else if (a.is_compute()) {
        if (optim >= 0) refuse(s, r, i, "comes after the optimizer step (OPTIM at position " + std::to_string(optim) + ")");
        if (gated && holds[a.stage] == 0)
          refuse(s, r, i, "computes while the parameters of " + stage() + " are sharded (no GATHER since its last RELEASE)");
      }
    }
    for (int64_t st = 0; st < s.stages(); ++st)
      if (holds[st] > 0) refuse(s, r, -1, "stage " + std::to_string(st) + " is gathered and never released");
    if (optim >= 0) ++stepping;
    else if (first_without < 0) first_without = r;
  }
  if (stepping > 0 && first_without >= 0)
    refuse(s, first_without, -1, "has no OPTIM while " + std::to_string(stepping) + " other rank(s) step the optimizer");
}

}  // namespace

void validate_schedule(const Schedule& s) {
  require(static_cast<int64_t>(s.ranks.size()) == s.pp, schedule_title(s), ": ", s.ranks.size(),
          " rows of actions, one per pipeline rank expected (", s.pp, ")");
  require(s.placement == Placement::loop || s.v == 2, schedule_title(s), ": V placement needs 2 stages per rank");
  Where where(s.stages(), s.micro_batches);
  for (int64_t r = 0; r < s.pp; ++r)
    for (int64_t i = 0; i < static_cast<int64_t>(s.ranks[r].size()); ++i) {
      const Action& a = s.ranks[r][i];
      if (a.op == Op::Optim) continue;
      if (a.stage < 0 || a.stage >= s.stages())
        refuse(s, r, i, "stage " + std::to_string(a.stage) + " does not exist (" + std::to_string(s.stages()) + " stages)");
      if (a.micro < 0 || a.micro >= s.micro_batches)
        refuse(s, r, i, "micro-batch " + std::to_string(a.micro) + " does not exist (" +
                            std::to_string(s.micro_batches) + " per step)");
      if (s.rank_of(a.stage) != r)
        refuse(s, r, i, "stage " + std::to_string(a.stage) + " is held by rank " + std::to_string(s.rank_of(a.stage)));
      if (a.is_parameter()) continue;  // checked below
      if (!where.emplace(a, r, i)) refuse(s, r, i, "appears twice");
    }
  auto find = [&](Op op, int64_t stage, int64_t micro) { return where.find(op, stage, micro); };
  // Every (stage, micro-batch): its compute, in order on its rank.
  for (int64_t stage = 0; stage < s.stages(); ++stage)
    for (int64_t j = 0; j < s.micro_batches; ++j) {
      const int64_t r = s.rank_of(stage);
      const Action f{Op::F, stage, j};
      const bool split = find(Op::I, stage, j).first >= 0;  // this backward is I and W, else one B
      const Action back{split ? Op::I : Op::B, stage, j};
      const auto fpos = find(Op::F, stage, j), bpos = find(back.op, stage, j), wpos = find(Op::W, stage, j);
      if (fpos.first < 0) refuse(s, r, -1, "the forward " + f.str() + " is missing");
      if (bpos.first < 0) refuse(s, r, -1, "the backward " + back.str() + " (or " + Action{Op::I, stage, j}.str() +
                                               " and " + Action{Op::W, stage, j}.str() + ") is missing");
      if (bpos.second < fpos.second) refuse(s, r, bpos.second, "comes before its forward " + f.str());
      if (split) {
        const auto full = find(Op::B, stage, j);
        if (full.first >= 0) refuse(s, r, full.second, "a full backward beside its split one " + back.str());
        if (wpos.first < 0) refuse(s, r, -1, "the weight gradient " + Action{Op::W, stage, j}.str() + " is missing");
        if (wpos.second < bpos.second) refuse(s, r, wpos.second, "comes before its input gradient " + back.str());
      } else if (wpos.first >= 0) {
        refuse(s, r, wpos.second, "a weight gradient without its input gradient " + Action{Op::I, stage, j}.str());
      }
      // Transfers between ranks: forward to stage+1, gradient to stage-1.
      for (const bool forward : {true, false}) {
        const int64_t peer_stage = forward ? stage + 1 : stage - 1;
        const bool needed = peer_stage >= 0 && peer_stage < s.stages() && s.rank_of(peer_stage) != r;
        const Op send_op = forward ? Op::SendF : Op::SendB, recv_op = forward ? Op::RecvF : Op::RecvB;
        const auto send = find(send_op, stage, j), recv = find(recv_op, peer_stage, j);
        const auto producer = forward ? fpos : bpos;
        if (!needed) {
          if (send.first >= 0) refuse(s, send.first, send.second, "sends where no transfer is (the next stage is on this rank or there is none)");
          continue;
        }
        const int64_t peer = s.rank_of(peer_stage);
        const auto consumer = forward ? find(Op::F, peer_stage, j)
                                      : find(find(Op::I, peer_stage, j).first >= 0 ? Op::I : Op::B, peer_stage, j);
        if (send.first < 0)
          refuse(s, r, producer.second, "its output goes to rank " + std::to_string(peer) + " but no " +
                                            Action{send_op, stage, j}.str() + " follows it");
        if (send.second < producer.second) refuse(s, r, send.second, "sends before its data is computed");
        if (recv.first < 0)
          refuse(s, peer, consumer.second, "its input comes from rank " + std::to_string(r) + " but no " +
                                               Action{recv_op, peer_stage, j}.str() + " precedes it");
        if (consumer.second >= 0 && recv.second > consumer.second)
          refuse(s, peer, recv.second, "receives after the action that needs it");
      }
    }
  for (int64_t stage = 0; stage < s.stages(); ++stage)
    for (int64_t j = 0; j < s.micro_batches; ++j) {
      const auto recv_f = find(Op::RecvF, stage, j), recv_b = find(Op::RecvB, stage, j);
      if (recv_f.first >= 0 && (stage == 0 || s.rank_of(stage - 1) == recv_f.first))
        refuse(s, recv_f.first, recv_f.second, "receives where no transfer is");
      if (recv_b.first >= 0 && (stage + 1 >= s.stages() || s.rank_of(stage + 1) == recv_b.first))
        refuse(s, recv_b.first, recv_b.second, "receives where no transfer is");
    }
  check_parameter_actions(s);
  const Simulation sim = simulate_schedule(s, {}, Timeline::skip);
  if (!sim.stuck.empty()) {
    std::string blocked;
    for (const BlockedRank& b : sim.stuck)
      blocked += "\n  rank " + std::to_string(b.rank) + " at " + s.ranks[b.rank][b.index].str() + " waits for " + b.waits_for;
    refuse(s, sim.stuck.front().rank, sim.stuck.front().index,
           "can never run: the table deadlocks (a cycle of waits across ranks):" + blocked);
  }
  for (int64_t r = 0; r < s.pp && r < static_cast<int64_t>(s.peak_limit.size()); ++r)
    if (s.peak_limit[r] > 0 && sim.peak_held[r] > s.peak_limit[r])
      refuse(s, r, -1, "holds " + std::to_string(sim.peak_held[r]) + " micro-batches' activations at once, more than the " +
                           std::to_string(s.peak_limit[r]) + " the schedule states");
}

}  // namespace tessera::pipeline
