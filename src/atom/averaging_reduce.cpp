// The reduce phase of an averaging round: the pipelined butterfly all-reduce (averaging.h).
//
// One attempt's state on this member is its Slot, shared by two kinds of thread:
//   - run_round's thread (reduce()): adds this member's own pieces (each once final, for a
//     contribution still being computed); sends, one message at a time over its channels to the
//     others in shift order (member me + 1 first), a band of each one's pieces and the pieces of
//     this member's sum summed so far, until all went; waits for the others' sums;
//   - one listener thread per other member j (serve_part, j's channel here): j's pieces of this
//     member's part, added as they come, and the pieces of j's part's sum.
// The thread whose piece completes a piece of this member's part (every member's contribution to
// it in) combines it, encodes its sum once, and publishes it for the sender. Pieces come in order
// on each channel, so piece k completes no later than piece k + 1 is in from everyone.
#include <algorithm>
#include <cmath>
#include <functional>
#include <thread>

#include <nlohmann/json.hpp>
#include <ATen/ATen.h>

#include "atom/averaging.h"
#include "atom/peer_record.h"
#include "core/fault_injection.h"

namespace tessera::atom {
namespace {

using Range = std::pair<int64_t, int64_t>;

// Each member's screening over the parts: its kept share averaged over the parts that screened
// it, an outlier where more than half of the parts found it one. Empty under mean.
std::vector<Screening> combine_screenings(const std::vector<RoundMember>& members,
                                          const std::vector<std::vector<Screening>>& by_part) {
  std::vector<Screening> combined;
  for (const RoundMember& m : members) {
    double kept = 0;
    int64_t parts = 0, outliers = 0;
    for (const std::vector<Screening>& part : by_part)
      for (const Screening& s : part)
        if (s.member == m.id) {
          kept += s.kept;
          ++parts;
          outliers += s.outlier ? 1 : 0;
        }
    if (parts > 0) combined.push_back({m.id, kept / static_cast<double>(parts), 2 * outliers > parts});
  }
  return combined;
}

}  // namespace

std::vector<std::pair<int64_t, int64_t>> round_pieces(int64_t numel, int64_t members, int64_t owner, bool whole) {
  if (whole || numel <= members * kSparseChunk) return {{numel * owner / members, numel * (owner + 1) / members}};
  const int64_t chunks = (numel + kSparseChunk - 1) / kSparseChunk;
  const int64_t cell = std::max<int64_t>(1, (chunks + members * kPiecesPerPart - 1) / (members * kPiecesPerPart)) *
                       kSparseChunk;
  const int64_t rows = std::max<int64_t>(1, (numel + cell * members - 1) / (cell * members));
  std::vector<Range> pieces;
  for (int64_t r = rows - 1; r >= 0; --r) {
    const int64_t b = std::min(numel, (r * members + owner) * cell), e = std::min(numel, b + cell);
    if (b < e || rows == 1) pieces.emplace_back(b, e);
  }
  return pieces;
}

// One attempt's reduction on this member (see the top of this file).
struct Averager::Slot {
  std::vector<RoundMember> members;
  int64_t me = 0, numel = 0;  // this member's index; the whole vector's entries
  PartEncoding encoding, sums;  // how the contributions and the sums travel
  bool whole = false;           // a robust rule: every part is one piece
  at::Tensor sum;               // [numel]: each part's sum as its owner sent it

  // This member's part: its pieces' aggregators, contributions in, and encoded sums (SUM bodies).
  std::vector<std::unique_ptr<PartAggregator>> aggregators;
  std::vector<int64_t> received;
  std::vector<std::string> replies;  // empty until the piece is summed
  int64_t replies_ready = 0;
  std::map<std::string, double> member_weight;  // by member: the weight its first piece carried

  // The others' sums: the pieces still to come, and each owner's weight and screening.
  int64_t sums_missing = 0;
  std::vector<double> weights;
  std::vector<std::vector<Screening>> screened;

  std::vector<std::string> errors;  // by member
  bool failed = false;
  uint64_t bytes_received = 0;  // the channels this member's listener read
  int64_t readers = 0;          // serve_part threads reading a channel of this attempt
  double part_summed = 0;

  // Part j's pieces, as [begin, end) of the whole vector, in the order they travel.
  std::vector<Range> pieces_of(int64_t j) const {
    return round_pieces(numel, static_cast<int64_t>(members.size()), j, whole);
  }
  void fail(size_t j, const std::string& why) {
    if (errors[j].empty()) errors[j] = why;
    failed = true;
  }
};

std::shared_ptr<Averager::Slot> Averager::slot_for(const std::string& token, bool create) {
  auto it = slots_.find(token);
  if (it != slots_.end()) return it->second;
  if (!create) return nullptr;
  return slots_[token] = std::make_shared<Slot>();
}

// Piece k of this member's part has every contribution: its sum, encoded once, goes to the
// sender; this member takes it as the others will decode it, so every member ends equal. Called
// without the lock by the one thread whose contribution completed the piece.
void Averager::sum_piece(const std::shared_ptr<Slot>& slot, size_t k) {
  std::vector<Screening> screened;
  PartAggregator& aggregator = *slot->aggregators[k];
  const at::Tensor sum = aggregator.finish(screened);
  nlohmann::json header = {{"piece", k}, {"weight", aggregator.weight()}};
  if (rule_.kind != Aggregation::mean) {
    header["screened"] = nlohmann::json::array();
    for (const Screening& s : screened) header["screened"].push_back({s.member, s.kept, s.outlier});
  }
  std::string reply = pack(header, encode_part(sum, slot->sums));
  if (k == 0) fault::point("swarm.sum");
  const auto [b, e] = slot->pieces_of(slot->me)[k];
  slot->sum.slice(0, b, e).copy_(decode_part(parse_sum(reply, "this peer").payload, e - b, slot->sums, "this peer"));
  std::lock_guard<std::mutex> lock(mutex_);
  slot->replies[k] = std::move(reply);
  slot->weights[static_cast<size_t>(slot->me)] = aggregator.weight();
  if (!screened.empty()) slot->screened[static_cast<size_t>(slot->me)] = std::move(screened);
  if (++slot->replies_ready == static_cast<int64_t>(slot->replies.size())) slot->part_summed = unix_now();
  changed_.notify_all();
}

bool Averager::serve_part(Channel& channel, const Message& first, uint64_t read_before) {
  const std::string& from = channel.address();
  const PartMessage opening = parse_part(first.body, from);
  const std::string token = opening.token;
  const Deadline deadline = Deadline::in(opening.wait_s);
  std::shared_ptr<Slot> slot;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    // The channel may open before this member learned its group: wait for the slot.
    // A slot that failed already still checks the first part's rule below, so that each owner
    // names a member under another rule even when another failure came first.
    changed_.wait_until(lock, deadline.at, [&] { return (slot = slot_for(token, false)) != nullptr; });
    if (!slot) return false;
    ++slot->readers;
  }
  Reading<Slot> reading{*this, *slot, channel, read_before};
  const auto m = std::find_if(slot->members.begin(), slot->members.end(),
                              [&](const RoundMember& r) { return r.id == channel.peer_id(); });
  const size_t j = static_cast<size_t>(m - slot->members.begin());
  if (m == slot->members.end() || static_cast<int64_t>(j) == slot->me) {
    std::lock_guard<std::mutex> lock(mutex_);
    slot->fail(static_cast<size_t>(slot->me), "peer " + from + " is not a member of this round");
    changed_.notify_all();
    throw WireError("peer " + from + " sent a part to a round it is not a member of");
  }
  const std::vector<Range> mine = slot->pieces_of(slot->me), theirs = slot->pieces_of(static_cast<int64_t>(j));
  size_t parts = 0, sums = 0;
  try {
    Message message = first;
    for (;;) {
      if (message.type == kPart) {
        const PartMessage part = parse_part(message.body, from);
        const size_t k = static_cast<size_t>(part.piece);
        const bool fits = part.token == token && k == parts && k < mine.size() &&
                          part.numel == mine[k].second - mine[k].first;
        if (part.rule != rule_.kind)
          throw WireError("member " + channel.peer_id() + " (" + from + ") aggregates by " +
                          aggregation_name(part.rule) + " and this peer by " + aggregation_name(rule_.kind) +
                          "; swarm.aggregation must be the same on every peer");
        if (!fits) throw WireError("peer " + from + " sent a part that does not fit this round");
        const at::Tensor values = decode_part(part.payload, part.numel, slot->encoding, from);
        bool complete = false;
        {
          std::lock_guard<std::mutex> lock(mutex_);
          if (slot->failed) return false;
          const auto [weight, fresh] = slot->member_weight.emplace(channel.peer_id(), part.weight);
          if (!fresh && weight->second != part.weight)
            throw WireError("peer " + from + " sent pieces of one part with different weights");
          slot->aggregators[k]->add(channel.peer_id(), values, part.weight);
          complete = ++slot->received[k] == static_cast<int64_t>(slot->members.size());
        }
        if (complete) sum_piece(slot, k);
        ++parts;
      } else if (message.type == kSum) {
        const SumReply sum = parse_sum(message.body, from);
        const size_t k = static_cast<size_t>(sum.piece);
        if (k != sums || k >= theirs.size()) throw WireError("peer " + from + " sent a sum that does not fit this round");
        const auto [b, e] = theirs[k];
        slot->sum.slice(0, b, e).copy_(decode_part(sum.payload, e - b, slot->sums, from));
        std::lock_guard<std::mutex> lock(mutex_);
        if (k > 0 && slot->weights[j] != sum.weight)
          throw WireError("peer " + from + " sent pieces of one sum with different weights");
        slot->weights[j] = sum.weight;
        if (k == 0) slot->screened[j] = sum.screened;
        --slot->sums_missing;
        changed_.notify_all();
        ++sums;
      } else {
        throw WireError("peer " + from + " sent a message of type " + std::to_string(message.type) + " in a round");
      }
      if (parts == mine.size() && sums == theirs.size()) return true;
      message = channel.receive(deadline);
    }
  } catch (const std::exception& e) {
    std::lock_guard<std::mutex> lock(mutex_);
    slot->fail(j, "member " + channel.peer_id() + " (" + from + "): " + e.what());
    changed_.notify_all();
    throw;
  }
}

void Averager::reduce(int64_t round, const std::string& token, const std::vector<RoundMember>& members, int64_t me,
                      const at::Tensor& flat, double weight, const PartEncoding& encoding, Deadline deadline,
                      const ContributionProgress* progress, RoundResult& result) {
  const int64_t n = static_cast<int64_t>(members.size()), numel = flat.numel();
  const bool exact = encoding.exact();
  result.sum = at::empty({numel}, at::kFloat);
  // What the round counts of this member's contribution: the contribution itself where the
  // encoding is exact, else each piece decoded from what was sent.
  result.delivered = exact ? flat : at::empty({numel}, at::kFloat);
  const auto is_final = [&](const Range& r) { return !progress || progress->final(r.first, r.second); };
  std::shared_ptr<Slot> slot;
  // Each part's pieces in the order they travel (Slot::pieces_of); this member's own among them.
  const bool whole = rule_.kind != Aggregation::mean;
  std::vector<std::vector<Range>> pieces(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) pieces[static_cast<size_t>(j)] = round_pieces(numel, n, j, whole);
  const std::vector<Range>& own = pieces[static_cast<size_t>(me)];
  {
    std::lock_guard<std::mutex> lock(mutex_);
    slot = slot_for(token, true);
    slot->members = members;
    slot->me = me;
    slot->numel = numel;
    slot->encoding = encoding;
    slot->sums = sum_encoding(encoding);
    slot->whole = whole;
    slot->sum = result.sum;
    for (int64_t j = 0; j < n; ++j)
      if (j != me) slot->sums_missing += static_cast<int64_t>(pieces[static_cast<size_t>(j)].size());
    slot->weights.assign(static_cast<size_t>(n), 0.0);
    slot->screened.assign(static_cast<size_t>(n), {});
    slot->errors.assign(static_cast<size_t>(n), "");
    slot->replies.assign(own.size(), "");
    slot->received.assign(own.size(), 0);
    for (const auto& [b, e] : own) slot->aggregators.push_back(std::make_unique<PartAggregator>(rule_, e - b));
    changed_.notify_all();
  }
  // This member's own piece k, as the others' count (encoded and decoded), once it is final.
  size_t own_added = 0;
  const auto add_own = [&](size_t k) {
    const auto [b, e] = own[k];
    const at::Tensor values = decode_part(encode_part(flat.slice(0, b, e), encoding), e - b, encoding, "this peer");
    if (!exact) result.delivered.slice(0, b, e).copy_(values);
    bool complete = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      slot->aggregators[k]->add(my_id_, values, weight);
      complete = ++slot->received[k] == n;
    }
    if (complete) sum_piece(slot, k);
  };
  const size_t own_pieces = own.size();
  // A channel to every other member: the one kept from an earlier round, else opened now, all at
  // once while the links are idle (one opened later would queue its handshake behind this
  // member's own data).
  std::vector<std::unique_ptr<Channel>> channels(static_cast<size_t>(n));
  std::vector<uint64_t> sent_before(static_cast<size_t>(n), 0);
  const auto fail = [&](int64_t j, const std::string& why) {
    const RoundMember& m = members[static_cast<size_t>(j)];
    std::lock_guard<std::mutex> lock(mutex_);
    slot->fail(static_cast<size_t>(j), "member " + m.id + " (" + m.address + "): " + why);
    changed_.notify_all();
  };
  {
    std::vector<std::thread> connects;
    for (int64_t j = 0; j < n; ++j)
      if (j != me)
        connects.emplace_back([&, j] {
          try {
            channels[static_cast<size_t>(j)] =
                channel_to(members[static_cast<size_t>(j)], deadline, sent_before[static_cast<size_t>(j)]);
          } catch (const std::exception& e) {
            fail(j, e.what());
          }
        });
    for (std::thread& t : connects) t.join();
  }
  // One message at a time, in shift order (member me + 1, me + 2, ...): to each, a band of
  // kRowsPerBand of its pieces (each once final) and the pieces of this member's sum summed so far,
  // then the next member. In step, every member's link carries one flow each way at a time, as a
  // ring's does; several flows at once through a rate-limited link lose about a third of it to
  // TCP's losses (bench/results/link_flows_cpu.md).
  // A send that fails ends that member's channel and fails the round, naming it; the others'
  // parts still go out, so each owner learns why from its own members (a rule that differs is
  // named by the owner that sees it).
  uint64_t sent = 0;  // by the channels ended or kept
  // Counts what channel j carried in this attempt, then closes it or keeps it for the next round.
  const auto let_go = [&](size_t j, bool kept = false) {
    sent += channels[j]->bytes_sent() - sent_before[j];
    if (kept) keep(members[j], std::move(channels[j]));
    channels[j].reset();
  };
  std::vector<size_t> parts_sent(static_cast<size_t>(n), 0), sums_sent(static_cast<size_t>(n), 0);
  const auto band_end = [&](size_t j) {
    return std::min(pieces[j].size(), (parts_sent[j] / kRowsPerBand + 1) * kRowsPerBand);
  };
  const auto reply = [&](size_t k) {
    std::lock_guard<std::mutex> lock(mutex_);
    return slot->replies[k];
  };
  // Sends what member j can take now; true when it sent anything.
  const auto serve_member = [&](size_t j) {
    bool any = false;
    try {
      for (const size_t end = band_end(j); channels[j] && parts_sent[j] < end && is_final(pieces[j][parts_sent[j]]);) {
        const size_t k = parts_sent[j]++;
        const auto [b, e] = pieces[j][k];
        const std::string head = pack_head({{"token", token},
                                            {"piece", k},
                                            {"numel", e - b},
                                            {"weight", weight},
                                            {"wait_s", deadline.seconds_left()},
                                            {"rule", aggregation_name(rule_.kind)}});
        if (exact) {  // dense float32: the values go from where they lie
          at::Tensor host;
          channels[j]->send(kPart, head, fp32_part_bytes(flat.slice(0, b, e), host), deadline);
        } else {
          const std::string values = encode_part(flat.slice(0, b, e), encoding);
          result.delivered.slice(0, b, e).copy_(decode_part(values, e - b, encoding, "this peer"));
          channels[j]->send(kPart, head, values, deadline);
        }
        any = true;
      }
      // A channel opens with a piece (its token finds the round at the reader), then sums may come.
      for (std::string body; channels[j] && parts_sent[j] > 0 && sums_sent[j] < own_pieces &&
                             !(body = reply(sums_sent[j])).empty();) {
        channels[j]->send(kSum, body, deadline);
        ++sums_sent[j];
        any = true;
      }
    } catch (const std::exception& e) {
      fail(static_cast<int64_t>(j), e.what());
      let_go(j);
    }
    return any;
  };
  // What is left to do here: own pieces to add, pieces and sums to send.
  const auto pending = [&] {
    bool left = own_added < own_pieces;
    for (size_t j = 0; j < channels.size(); ++j)
      if (channels[j]) left = left || parts_sent[j] < pieces[j].size() || sums_sent[j] < own_pieces;
    return left;
  };
  // Whether anything of it can be done now (under mutex_).
  const auto actionable = [&] {
    if (own_added < own_pieces && is_final(own[own_added])) return true;
    for (size_t j = 0; j < channels.size(); ++j) {
      if (!channels[j]) continue;
      if (parts_sent[j] < pieces[j].size() && is_final(pieces[j][parts_sent[j]])) return true;
      if (parts_sent[j] > 0 && sums_sent[j] < own_pieces && !slot->replies[sums_sent[j]].empty()) return true;
    }
    return false;
  };
  while (pending()) {
    for (; own_added < own_pieces && is_final(own[own_added]); ++own_added) add_own(own_added);
    bool any = false;
    for (int64_t s = 1; s < n; ++s) any = serve_member(static_cast<size_t>((me + s) % n)) || any;
    if (any) continue;
    std::unique_lock<std::mutex> lock(mutex_);
    std::string withdrawn;
    const bool ready = changed_.wait_until(lock, deadline.at, [&] {
      return slot->failed || !(withdrawn = progress ? progress->withdrawn() : "").empty() || actionable();
    });
    if (!withdrawn.empty())
      slot->fail(static_cast<size_t>(me), "this peer withdrew its contribution: " + withdrawn);
    if (!ready || slot->failed) break;
  }

  bool failed = false;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    const bool done = changed_.wait_until(lock, deadline.at, [&] {
      return (slot->replies_ready == static_cast<int64_t>(own_pieces) && slot->sums_missing == 0) || slot->failed;
    });
    if (slot->replies_ready < static_cast<int64_t>(own_pieces)) {
      int64_t in = 0;
      for (int64_t r : slot->received) in += r;
      slot->fail(static_cast<size_t>(me), "this peer's part received " + std::to_string(in) + " of " +
                                              std::to_string(n * static_cast<int64_t>(own_pieces)) +
                                              " contributions (pieces x members)");
    } else if (!done) {
      slot->fail(static_cast<size_t>(me), "this peer received " + std::to_string(slot->sums_missing) +
                                              " piece(s) of the others' sums too few before the deadline");
    }
    failed = slot->failed;
    changed_.notify_all();
  }
  // A failed attempt's channels end here, so a member still reading one ends too (a completed
  // one's members read all this member sent). Then every channel read here ends (its member sent
  // everything, closed it or failed), so that what each reached here (a member under another rule,
  // say) is in the failure even after another failure came.
  if (failed)
    for (size_t j = 0; j < channels.size(); ++j)
      if (channels[j]) let_go(j);
  std::string failure;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait_until(lock, deadline.at, [&] { return slot->readers == 0; });
    // Each channel as the wire carried it in this attempt, TLS included (a new one's handshake):
    // this member's (below) and its listener's.
    result.bytes_received = slot->bytes_received;
    result.part_summed = slot->part_summed;
    for (const std::string& e : slot->errors)
      if (!e.empty()) failure += (failure.empty() ? "" : "; ") + e;
    slots_.erase(token);
  }
  // Kept for the next round when every request on them completed; the channels to members not in
  // this round are let go.
  {
    std::lock_guard<std::mutex> lock(kept_mutex_);
    for (auto it = kept_.begin(); it != kept_.end();)
      it = std::any_of(members.begin(), members.end(), [&](const RoundMember& m) { return m.id == it->first; })
               ? std::next(it)
               : kept_.erase(it);
  }
  for (size_t j = 0; j < channels.size(); ++j)
    if (channels[j]) let_go(j, failure.empty());
  result.bytes_sent = sent;
  if (!failure.empty()) throw RoundError("round " + std::to_string(round) + " failed: " + failure);
  result.weight = slot->weights[0];
  for (double w : slot->weights)
    if (std::abs(w - result.weight) > 1e-6 * std::max(1.0, std::abs(w)))
      throw RoundError("round " + std::to_string(round) + " failed: the members' weights disagree");
  result.screened = combine_screenings(members, slot->screened);
}

}  // namespace tessera::atom
