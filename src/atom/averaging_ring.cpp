// The ring's reduce phase of an averaging round (averaging.h, "Ring"): the mean of three or more
// members, dense float32.
//
// Units: row t (travel order, last row first) and step s in [0, 2 (n - 1)). Member m sends to
// m + 1 only, and reads from m - 1 only:
//   s <  n - 1  its partial sum of cell (m - s) mod n: its own cell at s = 0, else the partial
//               m - 1 sent at step s - 1 (which was of that cell) plus its own;
//   s == n - 1  the whole sum of cell (m + 1) mod n: m - 1's partial of step n - 2 plus its own,
//               computed here only, so every member ends with these bytes;
//   s >  n - 1  the whole sum m - 1 sent at step s - 1, passed on.
// One attempt's state on this member is its RingSlot, shared by run_round's thread
// (reduce_ring(): computes and sends each unit once what it needs is final here and in from
// m - 1, rows in travel order, so rows pipeline round the ring) and the listener's thread reading
// m - 1's channel (serve_ring(): stores each unit, and a whole sum in place in the result).
#include <algorithm>
#include <cmath>
#include <map>
#include <memory>

#include <nlohmann/json.hpp>
#include <ATen/ATen.h>

#include "atom/averaging.h"
#include "atom/peer_record.h"
#include "core/fault_injection.h"

namespace tessera::atom {
namespace {

using Range = std::pair<int64_t, int64_t>;

int64_t wrap(int64_t i, int64_t n) { return ((i % n) + n) % n; }

// round_pieces' cell: a whole number of kSparseChunk entries, about kPiecesPerPart rows.
int64_t cell_entries(int64_t numel, int64_t members) {
  const int64_t chunks = (numel + kSparseChunk - 1) / kSparseChunk;
  return std::max<int64_t>(1, (chunks + members * kPiecesPerPart - 1) / (members * kPiecesPerPart)) * kSparseChunk;
}

}  // namespace

int64_t ring_rows(int64_t numel, int64_t members) {
  if (numel <= members * kSparseChunk) return 1;
  const int64_t cell = cell_entries(numel, members);
  return std::max<int64_t>(1, (numel + cell * members - 1) / (cell * members));
}

std::pair<int64_t, int64_t> ring_cell(int64_t numel, int64_t members, int64_t t, int64_t c) {
  if (numel <= members * kSparseChunk) return {numel * c / members, numel * (c + 1) / members};
  const int64_t cell = cell_entries(numel, members), r = ring_rows(numel, members) - 1 - t;
  const int64_t b = std::min(numel, (r * members + c) * cell);
  return {b, std::min(numel, b + cell)};
}

struct Averager::RingSlot {
  std::string before;  // the member before this one (its id): the only one that sends here
  int64_t n = 0, me = 0, numel = 0, rows = 0;
  at::Tensor sum;  // [numel]: the whole sums, written as they are computed or come
  // Units in from the member before, by (row, step): values and weight, until used.
  std::map<std::pair<int64_t, int64_t>, std::pair<at::Tensor, double>> in;
  int64_t received = 0;
  std::vector<double> weights;  // by unit that carried a whole sum here: its weight
  bool failed = false;
  std::string error;
  uint64_t bytes_received = 0;
  int64_t readers = 0;
  void fail(const std::string& why) {
    if (error.empty()) error = why;
    failed = true;
  }
  int64_t units() const { return rows * 2 * (n - 1); }
  // The cell a unit of step s sent by member `from` carries.
  int64_t cell(int64_t from, int64_t s) const { return s < n - 1 ? wrap(from - s, n) : wrap(from + 1 - (s - (n - 1)), n); }
};

bool Averager::serve_ring(Channel& channel, const Message& first, uint64_t read_before) {
  const std::string& from = channel.address();
  const RingOpen opening = parse_ring_open(first.body, from);
  const std::string token = opening.token;
  const Deadline deadline = Deadline::in(opening.wait_s);
  std::shared_ptr<RingSlot> slot;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    // The channel may open before this member learned its group: wait for the slot.
    changed_.wait_until(lock, deadline.at, [&] {
      const auto it = ring_slots_.find(token);
      return it != ring_slots_.end() && (slot = it->second) != nullptr;
    });
    if (!slot) return false;
    ++slot->readers;
  }
  Reading<RingSlot> reading{*this, *slot, channel, read_before};
  const int64_t before = wrap(slot->me - 1, slot->n);
  try {
    if (channel.peer_id() != slot->before)
      throw WireError("peer " + from + " is not the member before this one in the round's ring");
    for (int64_t count = 1;; ++count) {
      const Message message = channel.receive(deadline);
      if (message.type != kRing)
        throw WireError("peer " + from + " sent a message of type " + std::to_string(message.type) + " in a ring");
      const RingMessage unit = parse_ring(message.body, from);
      if (unit.token != token || unit.row >= slot->rows || unit.step >= 2 * (slot->n - 1))
        throw WireError("peer " + from + " sent a ring unit that does not fit this round");
      const auto [b, e] = ring_cell(slot->numel, slot->n, unit.row, slot->cell(before, unit.step));
      if (unit.numel != e - b) throw WireError("peer " + from + " sent a ring unit of the wrong size");
      // A whole sum is final: it goes straight into its cell of the sum (cells are disjoint: no
      // lock), and is passed on from there.
      const bool whole = unit.step >= slot->n - 1;
      const at::Tensor values = whole ? slot->sum.slice(0, b, e) : at::empty({e - b}, at::kFloat);
      decode_fp32_part_into(unit.payload, values, from);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (slot->failed) return false;
        slot->in[{unit.row, unit.step}] = {values, unit.weight};
        if (whole) slot->weights.push_back(unit.weight);
        ++slot->received;
        changed_.notify_all();
      }
      if (count == slot->units()) return true;
    }
  } catch (const std::exception& e) {
    std::lock_guard<std::mutex> lock(mutex_);
    slot->fail("member " + channel.peer_id() + " (" + from + "): " + e.what());
    changed_.notify_all();
    throw;
  }
}

void Averager::reduce_ring(int64_t round, const std::string& token, const std::vector<RoundMember>& members,
                           int64_t me, const at::Tensor& flat, double weight, Deadline deadline,
                           const ContributionProgress* progress, RoundResult& result) {
  const int64_t n = static_cast<int64_t>(members.size()), numel = flat.numel(), steps = 2 * (n - 1);
  const RoundMember& next = members[static_cast<size_t>((me + 1) % n)];
  result.sum = at::empty({numel}, at::kFloat);
  result.delivered = flat;  // float32: the round counts it exactly
  auto slot = std::make_shared<RingSlot>();
  slot->before = members[static_cast<size_t>(wrap(me - 1, n))].id;
  slot->n = n, slot->me = me, slot->numel = numel, slot->rows = ring_rows(numel, n), slot->sum = result.sum;
  const int64_t rows = slot->rows, units = slot->units();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ring_slots_[token] = slot;
    changed_.notify_all();
  }
  const auto fail = [&](const std::string& why) {
    std::lock_guard<std::mutex> lock(mutex_);
    slot->fail(why);
    changed_.notify_all();
  };
  uint64_t sent_before = 0;
  std::unique_ptr<Channel> out;
  try {
    out = channel_to(next, deadline, sent_before);
    out->send(kRingOpen, pack({{"token", token}, {"wait_s", deadline.seconds_left()}}), deadline);
  } catch (const std::exception& e) {
    out.reset();
    fail("member " + next.id + " (" + next.address + "): " + e.what());
  }
  const auto is_final = [&](const Range& r) { return !progress || r.first >= r.second || progress->final(r.first, r.second); };
  // Takes what member me - 1 sent of row t at step s, if it came (under no lock).
  const auto take_in = [&](int64_t t, int64_t s, std::pair<at::Tensor, double>& unit) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = slot->in.find({t, s});
    if (it == slot->in.end()) return false;
    unit = std::move(it->second);
    slot->in.erase(it);
    return true;
  };
  int64_t rows_summed = 0;
  // Unit (t, s) of this member, if it can go now (see the top of this file).
  const auto unit_of = [&](int64_t t, int64_t s, at::Tensor& values, double& w) {
    std::pair<at::Tensor, double> got;
    if (s >= n) {
      if (!take_in(t, s - 1, got)) return false;
      values = got.first, w = got.second;
      return true;
    }
    const auto [b, e] = ring_cell(numel, n, t, s < n - 1 ? wrap(me - s, n) : wrap(me + 1, n));
    if (!is_final({b, e})) return false;
    const at::Tensor own = flat.slice(0, b, e);
    if (s == 0) {
      values = own, w = weight;
      return true;
    }
    if (!take_in(t, s - 1, got)) return false;
    w = got.second + weight;
    if (s < n - 1) {
      values = got.first.add_(own);  // the partial that came is this unit's alone
    } else {
      values = result.sum.slice(0, b, e);
      at::add_out(values, got.first, own);
      if (rows_summed++ == 0) fault::point("swarm.sum");
      if (rows_summed == rows) result.part_summed = unix_now();
      std::lock_guard<std::mutex> lock(mutex_);
      slot->weights.push_back(w);
    }
    return true;
  };
  std::vector<int64_t> step_of(static_cast<size_t>(rows), 0);  // by row: its next unit's step
  int64_t sent_units = 0;
  while (sent_units < units) {
    bool any = false;
    try {
      for (int64_t t = 0; t < rows && out; ++t)
        for (at::Tensor values; step_of[static_cast<size_t>(t)] < steps;) {
          double w = 0;
          const int64_t s = step_of[static_cast<size_t>(t)];
          if (!unit_of(t, s, values, w)) break;
          at::Tensor host;
          out->send(kRing,
                    pack_head({{"token", token},
                               {"row", t},
                               {"step", s},
                               {"numel", values.numel()},
                               {"weight", w},
                               {"wait_s", deadline.seconds_left()}}),
                    fp32_part_bytes(values, host), deadline);
          ++step_of[static_cast<size_t>(t)];
          ++sent_units;
          any = true;
        }
    } catch (const std::exception& e) {
      fail("member " + next.id + " (" + next.address + "): " + e.what());
    }
    if (any) continue;
    std::unique_lock<std::mutex> lock(mutex_);
    const std::string withdrawn = progress ? progress->withdrawn() : "";
    if (!withdrawn.empty()) slot->fail("this peer withdrew its contribution: " + withdrawn);
    if (!slot->failed && deadline.seconds_left() <= 0)
      slot->fail("this peer sent " + std::to_string(sent_units) + " of its " + std::to_string(units) +
                 " ring units and received " + std::to_string(slot->received) + " before the deadline");
    if (slot->failed || !out) break;
    // Woken by a unit from the member before, the contribution's progress or a failure; a bounded
    // wait, since a unit may have come between the look above and this wait.
    changed_.wait_until(lock, std::min(deadline.at, std::chrono::steady_clock::now() + std::chrono::milliseconds(20)));
  }
  bool failed = false;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    const bool done = changed_.wait_until(lock, deadline.at, [&] { return slot->received == units || slot->failed; });
    if (!done)
      slot->fail("this peer received " + std::to_string(slot->received) + " of " + std::to_string(units) +
                 " ring units from member " + slot->before + " before the deadline");
    failed = slot->failed;
    changed_.notify_all();
  }
  // A failed attempt's channel to the next member ends here, so that member fails too, and on
  // round the ring; the member before finds the same through its own.
  result.bytes_sent = out ? out->bytes_sent() - sent_before : 0;
  if (failed) out.reset();
  std::string failure;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait_until(lock, deadline.at, [&] { return slot->readers == 0; });
    result.bytes_received = slot->bytes_received;
    failure = slot->failed ? slot->error : "";
    ring_slots_.erase(token);
  }
  if (out) keep(next, std::move(out));
  if (!failure.empty()) throw RoundError("round " + std::to_string(round) + " failed: " + failure);
  result.weight = slot->weights.front();
  for (double w : slot->weights)
    if (std::abs(w - result.weight) > 1e-6 * std::max(1.0, std::abs(w)))
      throw RoundError("round " + std::to_string(round) + " failed: the members' weights disagree");
}

}  // namespace tessera::atom
