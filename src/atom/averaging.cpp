// Averaging rounds: group formation by the round's host (averaging.h); the butterfly all-reduce is
// averaging_reduce.cpp's.
#include "atom/averaging.h"

#include <algorithm>
#include <map>

#include <nlohmann/json.hpp>
#include <ATen/ATen.h>

#include "atom/peer_record.h"
#include "core/fault_injection.h"

namespace tessera::atom {
namespace {

bool holds(const std::vector<RoundMember>& members, const std::string& id) {
  return std::any_of(members.begin(), members.end(), [&](const RoundMember& m) { return m.id == id; });
}

void sort_by_id(std::vector<RoundMember>& members) {
  std::sort(members.begin(), members.end(), [](const RoundMember& a, const RoundMember& b) { return a.id < b.id; });
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
  std::map<std::string, std::pair<int64_t, std::string>> states;  // by joiner id: its JOIN's state step and digest
  bool decided = false;
  std::vector<RoundMember> members;
  std::string token;
  std::string reason;  // why a joiner is not in the group, when not the usual
  std::map<std::string, std::string> refused;  // by joiner id: why it was left out
  int overlap_choice = -1;  // the host's word to the group (set_overlap_choice), fixed when decided
};

Averager::Averager(const SwarmKey& key, std::string my_id, std::string my_address, size_t max_message_bytes,
                   AggregationRule rule, bool ring)
    : key_(key),
      my_id_(std::move(my_id)),
      my_address_(std::move(my_address)),
      max_bytes_(max_message_bytes),
      rule_(rule),
      ring_(ring) {}

bool Averager::serve(Channel& channel, const Message& first) {
  if (first.type != kJoin && first.type != kPart && first.type != kRingOpen) return false;
  uint64_t read_before = 0;  // the first request's bytes include the handshake
  for (Message request = first;;) {
    const bool clean = request.type == kJoin   ? serve_join(channel, request)
                       : request.type == kRingOpen ? serve_ring(channel, request, read_before)
                                               : serve_part(channel, request, read_before);
    if (!clean) return true;
    read_before = channel.bytes_received();
    // Kept by its member for a later round: its next request, checked for close() every 0.1 s.
    const Deadline idle = Deadline::in(kKeptIdleS);
    bool ready = false;
    while (!closing_ && !(ready = channel.wait_readable(Deadline::in(0.1))) && idle.seconds_left() > 0) {
    }
    if (!ready) return true;
    try {
      request = channel.receive(Deadline::in(10));
    } catch (const WireError&) {
      return true;  // its member let it go between requests
    }
    if (request.type != kJoin && request.type != kPart && request.type != kRingOpen)
      throw WireError("peer " + channel.address() + " sent a message of type " + std::to_string(request.type) +
                      " between rounds");
  }
}

void Averager::close() {
  closing_ = true;
  std::lock_guard<std::mutex> lock(kept_mutex_);
  kept_.clear();
}

std::unique_ptr<Channel> Averager::channel_to(const RoundMember& member, Deadline deadline, uint64_t& sent_before) {
  {
    std::lock_guard<std::mutex> lock(kept_mutex_);
    const auto it = kept_.find(member.id);
    if (it != kept_.end()) {
      std::unique_ptr<Channel> kept = std::move(it->second.second);
      const bool same = it->second.first == member.address;
      kept_.erase(it);
      // Nothing is ever sent to a member on its kept channel between requests: anything readable
      // there is its peer closing it (it left, restarted, or stayed idle too long).
      if (same && !kept->wait_readable(Deadline::in(0))) {
        sent_before = kept->bytes_sent();
        return kept;
      }
    }
  }
  const auto [h, p] = split_address(member.address, "a round member");
  sent_before = 0;
  return Channel::connect(h, p, key_, my_id_, deadline, max_bytes_);
}

void Averager::keep(const RoundMember& member, std::unique_ptr<Channel> channel) {
  std::lock_guard<std::mutex> lock(kept_mutex_);
  if (!closing_) kept_[member.id] = {member.address, std::move(channel)};
}

bool Averager::serve_join(Channel& channel, const Message& first) {
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
  g->states[member.id] = {join.state_step, join.state};
  changed_.notify_all();
  const bool decided =
      changed_.wait_for(lock, std::chrono::duration<double>(wait_s), [&] { return g->decided; });
  if (!decided) return false;  // the joiner's deadline passes: it retries the round
  const bool in = holds(g->members, member.id);
  nlohmann::json members = nlohmann::json::array();
  for (const RoundMember& m : g->members) members.push_back({m.id, m.address});
  const auto refused = g->refused.find(member.id);
  const std::string refusal = refused != g->refused.end() ? refused->second : "";
  lock.unlock();
  const std::string reason = !g->reason.empty() ? g->reason
                             : !refusal.empty() ? refusal
                             : !in              ? "this peer joined after the group was closed"
                             : g->token.empty() ? "the group was not a majority of the host's candidates"
                                                : "";
  channel.send(kGroup,
               pack({{"token", in ? g->token : ""}, {"members", members}, {"reason", reason},
                     {"overlap", g->overlap_choice}}),
               Deadline::in(10));
  return true;
}

std::vector<RoundMember> Averager::host(int64_t round, const std::vector<RoundMember>& candidates, std::string& token,
                                        Deadline gather, std::shared_ptr<Gather>& decided,
                                        const ContributionProgress* progress) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto& entry = gathers_[round];
  if (!entry) entry = std::make_shared<Gather>();
  const std::shared_ptr<Gather> g = entry;
  auto everyone_joined = [&] {
    return std::all_of(candidates.begin(), candidates.end(),
                       [&](const RoundMember& c) { return c.id == my_id_ || holds(g->joined, c.id); });
  };
  std::string withdrawn;
  changed_.wait_until(lock, gather.at,
                      [&] { return everyone_joined() || !(withdrawn = progress ? progress->withdrawn() : "").empty(); });
  if (!withdrawn.empty()) {
    // The joiners hear at once that there is no group; they retry with this peer's next round.
    g->reason = "the host withdrew its contribution (" + withdrawn + ")";
    g->decided = true;
    gathers_.erase(round);
    changed_.notify_all();
    throw RoundError("round " + std::to_string(round) + " failed: this peer withdrew its contribution: " + withdrawn);
  }
  g->members = {{my_id_, my_address_}};
  for (const RoundMember& m : g->joined) {
    const auto& [step, theirs] = g->states[m.id];
    if (!state_.empty() && !theirs.empty() && step == state_step_ && theirs != state_) {
      g->refused[m.id] = "its state at swarm step " + std::to_string(step) + " (digest " + theirs +
                         ") is not the host's (" + state_ +
                         "): the replicas diverged, and their gradients are not averaged together";
      continue;
    }
    if (!holds(g->members, m.id)) g->members.push_back(m);
  }
  sort_by_id(g->members);
  // Not a majority of the candidates: no token, so the joiners fail at once (run_round says why).
  g->token = 2 * g->members.size() > candidates.size() ? to_hex(random_bytes(8)) : "";
  g->overlap_choice = overlap_choice_;
  g->decided = true;
  token = g->token;
  gathers_.erase(round);  // later JOINs of this round start a new gather (a retry), unless it completes
  decided = g;
  changed_.notify_all();
  return g->members;
}

std::vector<RoundMember> Averager::join(int64_t round, const RoundMember& host, std::string& token, Deadline deadline,
                                        const ContributionProgress* progress, int& overlap_choice) {
  try {
    uint64_t sent_before = 0;
    std::unique_ptr<Channel> c = channel_to(host, deadline, sent_before);
    nlohmann::json join = {{"round", round}, {"address", my_address_}, {"wait_s", deadline.seconds_left()}};
    {
      std::lock_guard<std::mutex> lock(mutex_);
      join["state"] = state_;
      join["state_step"] = state_step_;
    }
    c->send(kJoin, pack(join), deadline);
    // A contribution still being computed may be withdrawn while the host gathers: look every 0.1 s.
    while (progress && deadline.seconds_left() > 0 && !c->wait_readable(Deadline::in(std::min(0.1, deadline.seconds_left()))))
      if (const std::string why = progress->withdrawn(); !why.empty())
        throw RoundError("round " + std::to_string(round) + " failed: this peer withdrew its contribution: " + why);
    const GroupReply group = parse_group(c->receive(deadline, kGroup).body, c->address());
    keep(host, std::move(c));  // the host is a member: this round's pieces to it go on this channel
    token = group.token;
    overlap_choice = group.overlap_choice;
    if (token.empty())
      throw RoundError("round " + std::to_string(round) + ": host " + host.id + " (" + host.address +
                       ") formed no group with this peer: " + group.reason);
    return group.members;
  } catch (const WireError& e) {
    throw RoundError("round " + std::to_string(round) + ": joining host " + host.id + " (" + host.address +
                     ") failed: " + e.what());
  }
}

void Averager::set_overlap_choice(int choice) {
  require(choice >= -1 && choice <= 1, "internal: an overlap choice of ", choice);
  std::lock_guard<std::mutex> lock(mutex_);
  overlap_choice_ = choice;
}

void Averager::set_state(int64_t step, const std::string& digest) {
  std::lock_guard<std::mutex> lock(mutex_);
  state_step_ = step;
  state_ = digest;
}

RoundResult Averager::run_round(int64_t round, std::vector<RoundMember> candidates, const at::Tensor& vector,
                                double weight, const PartEncoding& encoding, RoundClock& clock,
                                const std::shared_ptr<ContributionProgress>& progress) {
  if (progress) {
    require(vector.scalar_type() == at::kFloat && vector.is_contiguous() && vector.numel() == progress->numel(),
            "internal: a contribution still being computed is read in place (contiguous float32 of its progress' size)");
    progress->on_change([this] {
      std::lock_guard<std::mutex> lock(mutex_);
      changed_.notify_all();
    });
  }
  struct Unlisten {  // the progress may outlive this round
    ContributionProgress* progress;
    ~Unlisten() {
      if (progress) progress->on_change({});
    }
  } unlisten{progress.get()};
  const auto start = std::chrono::steady_clock::now();
  const double started = unix_now();
  fault::point("swarm.group");
  sort_by_id(candidates);
  require(holds(candidates, my_id_), "internal: a round's candidates include this peer");
  const double budget = clock.deadline_s();
  const Deadline gather = Deadline::in(budget / 2), deadline = Deadline::in(budget);
  std::string token;
  std::shared_ptr<Gather> hosted;  // the group this peer formed as the round's host
  int overlap_choice = -1;
  const std::vector<RoundMember> members =
      candidates.front().id == my_id_
          ? host(round, candidates, token, gather, hosted, progress.get())
          : join(round, candidates.front(), token, deadline, progress.get(), overlap_choice);
  if (hosted) overlap_choice = hosted->overlap_choice;
  const double grouped = unix_now();
  const int64_t n = static_cast<int64_t>(members.size());
  // A group holding half of this peer's candidates or fewer may be one side of a split view (two
  // hosts, each seen by some): it does not average, so no two groups of one round both do.
  if (2 * n <= static_cast<int64_t>(candidates.size()))
    throw RoundError("round " + std::to_string(round) + ": the group has " + std::to_string(n) + " of the " +
                     std::to_string(candidates.size()) + " candidates this peer sees; not a majority, retried");
  const int64_t me = std::find_if(members.begin(), members.end(), [&](const RoundMember& m) { return m.id == my_id_; }) -
                     members.begin();
  require(me < n, "internal: this peer is not in its round's group");
  const at::Tensor flat = vector.contiguous().to(at::kFloat).view({-1});
  const Deadline reduce_by = Deadline::in(budget);
  fault::point("swarm.reduce");
  RoundResult result;
  result.started = started;
  result.grouped = grouped;
  result.members = members;
  result.overlap_choice = overlap_choice;
  result.ring = ring_ && n >= 3 && rule_.kind == Aggregation::mean && encoding.exact();
  if (result.ring)
    reduce_ring(round, token, members, me, flat, weight, reduce_by, progress.get(), result);
  else
    reduce(round, token, members, me, flat, weight, encoding, reduce_by, progress.get(), result);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  result.finished = unix_now();
  clock.record(result.seconds);
  if (hosted) {
    // The round completed here: later JOINs of it are told they came late (a round that failed is
    // retried under the same number, so only a completed one is closed).
    std::lock_guard<std::mutex> lock(mutex_);
    closed_.emplace_back(round, hosted);
    if (closed_.size() > 8) closed_.pop_front();
    // JOINs that came while this attempt ran wait in a gather for its retry: there is none, so
    // they hear at once that they came late, rather than at their deadline.
    const auto pending = gathers_.find(round);
    if (pending != gathers_.end()) {
      pending->second->decided = true;
      gathers_.erase(pending);
      changed_.notify_all();
    }
  }
  return result;
}

}  // namespace tessera::atom
