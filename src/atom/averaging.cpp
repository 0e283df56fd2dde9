// Averaging rounds: group formation by the round's host and the butterfly all-reduce (averaging.h).
#include "atom/averaging.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <thread>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "atom/peer_record.h"
#include "core/fault_injection.h"

namespace tessera::atom {
namespace {

enum RoundMessage : uint8_t { kJoin = 10, kGroup = 11, kPart = 12, kSum = 13 };

bool holds(const std::vector<RoundMember>& members, const std::string& id) {
  return std::any_of(members.begin(), members.end(), [&](const RoundMember& m) { return m.id == id; });
}

void sort_by_id(std::vector<RoundMember>& members) {
  std::sort(members.begin(), members.end(), [](const RoundMember& a, const RoundMember& b) { return a.id < b.id; });
}

// [begin, end) of part `j` of `n` over `numel` elements.
std::pair<int64_t, int64_t> part_bounds(int64_t numel, int64_t n, int64_t j) {
  return {numel * j / n, numel * (j + 1) / n};
}

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

double RoundClock::deadline_s() const {
  if (recent_.empty()) return max_s_;
  return std::clamp(4.0 * *std::max_element(recent_.begin(), recent_.end()), min_s_, max_s_);
}

void RoundClock::record(double seconds) {
  recent_.push_back(seconds);
  if (recent_.size() > 8) recent_.erase(recent_.begin());
}

// The host's view of one round's JOINs.
struct Averager::Gather {
  std::vector<RoundMember> joined;
  bool decided = false;
  std::vector<RoundMember> members;
  std::string token;
};

// This member's owned part of one attempt: the contributions summed as they arrive.
struct Averager::Slot {
  int64_t expected = 0, received = 0;  // contributions, this member's own included
  std::unique_ptr<PartAggregator> aggregator;
  PartEncoding encoding;
  bool failed = false;
  std::string failure;  // why a member's part was refused
  std::string reply;  // the sum as sent back, encoded once when the slot completes
  uint64_t bytes_received = 0;
  std::vector<std::string> from;
};

Averager::Averager(const SwarmKey& key, std::string my_id, std::string my_address, size_t max_message_bytes,
                   AggregationRule rule)
    : key_(key),
      my_id_(std::move(my_id)),
      my_address_(std::move(my_address)),
      max_bytes_(max_message_bytes),
      rule_(rule) {}

bool Averager::serve(Channel& channel, const Message& first) {
  if (first.type == kJoin) serve_join(channel, first);
  else if (first.type == kPart) serve_part(channel, first);
  else return false;
  return true;
}

void Averager::serve_join(Channel& channel, const Message& first) {
  const JoinRequest join = parse_join(first.body, channel.address());
  const int64_t round = join.round;
  const double wait_s = join.wait_s;
  const RoundMember member{channel.peer_id(), join.address};
  std::unique_lock<std::mutex> lock(mutex_);
  // A round whose group this host formed already: the joiner is late and hears so at once (it
  // would otherwise wait out its deadline on a gather nobody decides).
  const auto closed = std::find_if(closed_.begin(), closed_.end(), [&](const auto& c) { return c.first == round; });
  std::shared_ptr<Gather> g = closed != closed_.end() ? closed->second : gathers_[round];
  if (!g) g = gathers_[round] = std::make_shared<Gather>();
  g->joined.push_back(member);
  changed_.notify_all();
  const bool decided =
      changed_.wait_for(lock, std::chrono::duration<double>(wait_s), [&] { return g->decided; });
  if (!decided) return;  // the joiner's deadline passes: it retries the round
  const bool in = holds(g->members, member.id);
  nlohmann::json members = nlohmann::json::array();
  for (const RoundMember& m : g->members) members.push_back({m.id, m.address});
  lock.unlock();
  const std::string reason = !in ? "this peer joined after the group was closed"
                             : g->token.empty() ? "the group was not a majority of the host's candidates"
                                                : "";
  channel.send(kGroup, pack({{"token", in ? g->token : ""}, {"members", members}, {"reason", reason}}), Deadline::in(10));
}

std::vector<RoundMember> Averager::host(int64_t round, const std::vector<RoundMember>& candidates, std::string& token,
                                        Deadline gather, std::shared_ptr<Gather>& decided) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto& entry = gathers_[round];
  if (!entry) entry = std::make_shared<Gather>();
  const std::shared_ptr<Gather> g = entry;
  auto everyone_joined = [&] {
    return std::all_of(candidates.begin(), candidates.end(),
                       [&](const RoundMember& c) { return c.id == my_id_ || holds(g->joined, c.id); });
  };
  changed_.wait_until(lock, gather.at, everyone_joined);
  g->members = {{my_id_, my_address_}};
  for (const RoundMember& m : g->joined)
    if (!holds(g->members, m.id)) g->members.push_back(m);
  sort_by_id(g->members);
  // Not a majority of the candidates: no token, so the joiners fail at once (run_round says why).
  g->token = 2 * g->members.size() > candidates.size() ? to_hex(random_bytes(8)) : "";
  g->decided = true;
  token = g->token;
  gathers_.erase(round);  // later JOINs of this round start a new gather (a retry), unless it completes
  decided = g;
  changed_.notify_all();
  return g->members;
}

std::vector<RoundMember> Averager::join(int64_t round, const RoundMember& host, std::string& token, Deadline deadline) {
  const auto [h, p] = split_address(host.address, "the round's host");
  std::unique_ptr<Channel> c;
  try {
    c = Channel::connect(h, p, key_, my_id_, deadline, max_bytes_);
    c->send(kJoin, pack({{"round", round}, {"address", my_address_}, {"wait_s", deadline.seconds_left()}}), deadline);
    const GroupReply group = parse_group(c->receive(deadline, kGroup).body, c->address());
    token = group.token;
    if (token.empty())
      throw RoundError("round " + std::to_string(round) + ": host " + host.id + " (" + host.address +
                       ") formed no group with this peer: " + group.reason);
    return group.members;
  } catch (const WireError& e) {
    throw RoundError("round " + std::to_string(round) + ": joining host " + host.id + " (" + host.address +
                     ") failed: " + e.what());
  }
}

std::shared_ptr<Averager::Slot> Averager::slot_for(const std::string& token, bool create) {
  auto it = slots_.find(token);
  if (it != slots_.end()) return it->second;
  if (!create) return nullptr;
  return slots_[token] = std::make_shared<Slot>();
}

void Averager::serve_part(Channel& channel, const Message& first) {
  const PartMessage part = parse_part(first.body, channel.address());
  const std::string& token = part.token;
  const Deadline deadline = Deadline::in(part.wait_s);
  std::unique_lock<std::mutex> lock(mutex_);
  std::shared_ptr<Slot> slot;
  // The part may come before this member learned its group: wait for the slot.
  changed_.wait_until(lock, deadline.at, [&] { return (slot = slot_for(token, false)) != nullptr; });
  if (!slot || slot->failed) return;
  // A part of another size is refused before it is decoded (a sparse one names its size apart
  // from its bytes), and so is one summed by another rule.
  const bool fits = slot->aggregator && part.numel == slot->aggregator->numel();
  const bool same_rule = part.rule == rule_.kind;
  const PartEncoding encoding = slot->encoding;
  lock.unlock();
  const at::Tensor values =
      fits && same_rule ? decode_part(part.payload, part.numel, encoding, channel.address()) : at::Tensor();
  lock.lock();
  if (!same_rule) {
    slot->failure = "member " + channel.peer_id() + " (" + channel.address() + ") aggregates by " +
                    aggregation_name(part.rule) + " and this peer by " + aggregation_name(rule_.kind) +
                    "; swarm.aggregation must be the same on every peer";
  }
  if (!fits || !same_rule || slot->failed ||
      std::find(slot->from.begin(), slot->from.end(), channel.peer_id()) != slot->from.end()) {
    slot->failed = true;
    changed_.notify_all();
    throw WireError("peer " + channel.address() + " sent a part that does not fit this round");
  }
  slot->aggregator->add(channel.peer_id(), values, part.weight);
  slot->from.push_back(channel.peer_id());
  ++slot->received;
  slot->bytes_received += wire_bytes(first.body.size());
  changed_.notify_all();
  const bool complete = changed_.wait_until(lock, deadline.at, [&] { return !slot->reply.empty() || slot->failed; });
  if (!complete || slot->failed) return;
  lock.unlock();
  channel.send(kSum, slot->reply, deadline);
}

RoundResult Averager::run_round(int64_t round, std::vector<RoundMember> candidates, const at::Tensor& vector,
                                double weight, const PartEncoding& encoding, RoundClock& clock) {
  const auto start = std::chrono::steady_clock::now();
  const double started = unix_now();
  fault::point("swarm.group");
  sort_by_id(candidates);
  require(holds(candidates, my_id_), "internal: a round's candidates include this peer");
  const double budget = clock.deadline_s();
  const Deadline gather = Deadline::in(budget / 2), deadline = Deadline::in(budget);
  std::string token;
  std::shared_ptr<Gather> hosted;  // the group this peer formed as the round's host
  const std::vector<RoundMember> members = candidates.front().id == my_id_
                                               ? host(round, candidates, token, gather, hosted)
                                               : join(round, candidates.front(), token, deadline);
  const double grouped = unix_now();
  const int64_t n = static_cast<int64_t>(members.size()), numel = vector.numel();
  // A group holding half of this peer's candidates or fewer may be one side of a split view (two
  // hosts, each seen by some): it does not average, so no two groups of one round both do.
  if (2 * n <= static_cast<int64_t>(candidates.size()))
    throw RoundError("round " + std::to_string(round) + ": the group has " + std::to_string(n) + " of the " +
                     std::to_string(candidates.size()) + " candidates this peer sees; not a majority, retried");
  const int64_t me = std::find_if(members.begin(), members.end(), [&](const RoundMember& m) { return m.id == my_id_; }) -
                     members.begin();
  require(me < n, "internal: this peer is not in its round's group");
  const at::Tensor flat = vector.contiguous().to(at::kFloat).view({-1});
  const Deadline reduce = Deadline::in(budget);
  fault::point("swarm.reduce");
  // This member's slot: its own part first, as the others' parts count (encoded and decoded). The
  // slot's sum gathers the others' from the moment it is published, so `own` stays apart.
  const auto [own_begin, own_end] = part_bounds(numel, n, me);
  const at::Tensor own =
      decode_part(encode_part(flat.slice(0, own_begin, own_end), encoding), own_end - own_begin, encoding, "this peer");
  std::shared_ptr<Slot> slot;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    slot = slot_for(token, true);
    slot->encoding = encoding;
    slot->expected = n;
    slot->aggregator = std::make_unique<PartAggregator>(rule_, own_end - own_begin);
    slot->aggregator->add(my_id_, own, weight);
    slot->received = 1;
    changed_.notify_all();
  }
  RoundResult result;
  result.started = started;
  result.grouped = grouped;
  result.members = members;
  result.sum = at::empty({numel}, at::kFloat);
  // What the round counts of this member's contribution: the contribution itself where the
  // encoding is exact, else each part decoded from what was sent.
  const bool exact = encoding.exact();
  result.delivered = exact ? flat : at::empty({numel}, at::kFloat);
  if (!exact) result.delivered.slice(0, own_begin, own_end).copy_(own);
  const PartEncoding sums = sum_encoding(encoding);
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<double> weights(static_cast<size_t>(n), 0.0);
  std::vector<std::vector<Screening>> screened(static_cast<size_t>(n));  // by each part's owner
  std::atomic<uint64_t> sent{0}, received{0};
  std::vector<std::thread> exchanges;
  for (int64_t j = 0; j < n; ++j) {
    if (j == me) continue;
    exchanges.emplace_back([&, j] {
      const RoundMember& m = members[static_cast<size_t>(j)];
      const auto [b, e] = part_bounds(numel, n, j);
      try {
        const std::string mine = encode_part(flat.slice(0, b, e), encoding);
        if (!exact) result.delivered.slice(0, b, e).copy_(decode_part(mine, e - b, encoding, "this peer"));
        const auto [h, p] = split_address(m.address, "a round member");
        auto c = Channel::connect(h, p, key_, my_id_, reduce, max_bytes_);
        c->send(kPart,
                pack({{"token", token},
                      {"numel", e - b},
                      {"weight", weight},
                      {"wait_s", reduce.seconds_left()},
                      {"rule", aggregation_name(rule_.kind)}},
                     mine),
                reduce);
        const Message reply = c->receive(reduce, kSum);
        const SumReply sum = parse_sum(reply.body, c->address());
        result.sum.slice(0, b, e).copy_(decode_part(sum.payload, e - b, sums, c->address()));
        weights[static_cast<size_t>(j)] = sum.weight;
        screened[static_cast<size_t>(j)] = sum.screened;
        sent += c->bytes_sent();
        received += c->bytes_received();
      } catch (const std::exception& ex) {
        errors[static_cast<size_t>(j)] = "member " + m.id + " (" + m.address + "): " + ex.what();
      }
    });
  }
  {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait_until(lock, reduce.at, [&] { return slot->received == slot->expected || slot->failed; });
    const auto [b, e] = part_bounds(numel, n, me);
    if (slot->received == slot->expected && !slot->failed) {
      result.part_summed = unix_now();
      fault::point("swarm.sum");
      // The members receive the sum as encoded, and so does this one: every member ends equal.
      std::vector<Screening>& mine = screened[static_cast<size_t>(me)];
      const at::Tensor sum = slot->aggregator->finish(mine);
      nlohmann::json header = {{"weight", slot->aggregator->weight()}};
      if (rule_.kind != Aggregation::mean) {
        header["screened"] = nlohmann::json::array();
        for (const Screening& s : mine) header["screened"].push_back({s.member, s.kept, s.outlier});
      }
      slot->reply = pack(header, encode_part(sum, sums));
      changed_.notify_all();
      result.sum.slice(0, b, e).copy_(decode_part(parse_sum(slot->reply, "this peer").payload, e - b, sums, "this peer"));
      weights[static_cast<size_t>(me)] = slot->aggregator->weight();
    } else {
      errors[static_cast<size_t>(me)] = !slot->failure.empty()
                                            ? slot->failure
                                            : "this peer's part received " + std::to_string(slot->received) + " of " +
                                                  std::to_string(slot->expected) + " contributions";
    }
  }
  for (std::thread& t : exchanges) t.join();
  {
    // Wait briefly for this slot's replies to go out before it is dropped.
    std::unique_lock<std::mutex> lock(mutex_);
    if (!errors[static_cast<size_t>(me)].empty()) slot->failed = true;
    changed_.notify_all();
    // The parts and sums this member's listener received and sent, as the wire carried them.
    result.bytes_sent = sent + wire_bytes(slot->reply.size()) * static_cast<uint64_t>(n - 1);
    result.bytes_received = received + slot->bytes_received;
    slots_.erase(token);
  }
  std::string failure;
  for (const std::string& e : errors)
    if (!e.empty()) failure += (failure.empty() ? "" : "; ") + e;
  if (!failure.empty()) throw RoundError("round " + std::to_string(round) + " failed: " + failure);
  result.weight = weights[0];
  for (double w : weights)
    if (std::abs(w - result.weight) > 1e-6 * std::max(1.0, std::abs(w)))
      throw RoundError("round " + std::to_string(round) + " failed: the members' weights disagree");
  result.screened = combine_screenings(members, screened);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  result.finished = unix_now();
  clock.record(result.seconds);
  if (hosted) {
    // The round completed here: later JOINs of it are told they came late (a round that failed is
    // retried under the same number, so only a completed one is closed).
    std::lock_guard<std::mutex> lock(mutex_);
    closed_.emplace_back(round, hosted);
    if (closed_.size() > 8) closed_.pop_front();
  }
  return result;
}

}  // namespace tessera::atom
