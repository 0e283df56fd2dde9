// The pipeline executor (executor.h).
#include "parallel/pipeline/executor.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <tuple>

#include <ATen/ATen.h>

#include "core/error.h"

namespace tessera::pipeline {
namespace {

// (direction: 0 forward / 1 backward, consuming stage, micro-batch) -> a Gloo tag below 2^30.
int64_t transfer_tag(int64_t direction, int64_t stage, int64_t micro) {
  require(stage < (1 << 13) && micro < (1 << 16), "internal: pipeline stage ", stage, " or micro-batch ", micro,
          " too large for a transfer tag");
  return (direction << 29) | (stage << 16) | micro;
}

using Key = std::tuple<int64_t, int64_t, int64_t>;  // (direction, consuming stage, micro-batch)

// A transfer action's key and the rank at its other end.
Key transfer_key(const Action& a) {
  switch (a.op) {
    case Op::SendF: return {0, a.stage + 1, a.micro};
    case Op::SendB: return {1, a.stage - 1, a.micro};
    case Op::RecvF: return {0, a.stage, a.micro};
    default: return {1, a.stage, a.micro};
  }
}
int64_t peer_of(const Schedule& s, const Action& a) {
  switch (a.op) {
    case Op::SendF: return s.rank_of(a.stage + 1);
    case Op::SendB: return s.rank_of(a.stage - 1);
    case Op::RecvF: return s.rank_of(a.stage - 1);
    default: return s.rank_of(a.stage + 1);
  }
}

}  // namespace

std::map<size_t, std::vector<std::tuple<int64_t, int64_t, int64_t>>> arrived_sends(const Schedule& s, int64_t me) {
  std::vector<std::vector<Key>> taken(static_cast<size_t>(s.pp));  // per peer, my sends it takes, in order
  std::map<Key, size_t> before;  // a send to me -> how many of my sends its sender took before it
  for (int64_t p = 0; p < s.pp; ++p) {
    if (p == me) continue;
    for (const Action& a : s.ranks[p]) {
      if (!a.is_transfer() || peer_of(s, a) != me) continue;
      if (a.op == Op::RecvF || a.op == Op::RecvB) taken[p].push_back(transfer_key(a));
      else before[transfer_key(a)] = taken[p].size();
    }
  }
  std::map<size_t, std::vector<Key>> out;
  std::vector<size_t> released(static_cast<size_t>(s.pp), 0);
  const std::vector<Action>& row = s.ranks[me];
  for (size_t i = 0; i < row.size(); ++i) {
    if (row[i].op != Op::RecvF && row[i].op != Op::RecvB) continue;
    const int64_t p = peer_of(s, row[i]);
    const auto it = before.find(transfer_key(row[i]));
    if (it == before.end()) continue;
    for (; released[p] < it->second; ++released[p]) out[i].push_back(taken[p][released[p]]);
  }
  return out;
}

namespace {

// Rows of (op, stage, micro, start, end) for one rank's timeline, padded to `rows`.
at::Tensor timeline_rows(const std::vector<TimedAction>& timeline, int64_t rows) {
  at::Tensor t = at::full({rows, 5}, -1.0, at::kDouble);
  auto a = t.accessor<double, 2>();
  for (size_t i = 0; i < timeline.size(); ++i) {
    a[i][0] = static_cast<double>(timeline[i].action.op);
    a[i][1] = static_cast<double>(timeline[i].action.stage);
    a[i][2] = static_cast<double>(timeline[i].action.micro);
    a[i][3] = timeline[i].start;
    a[i][4] = timeline[i].end;
  }
  return t;
}

}  // namespace

std::vector<TimedAction> run_schedule(const Schedule& s, comm::Group& pipe, comm::Group& down, const StageWork& work,
                                      double* started) {
  require(down.ranks() == pipe.ranks(), "internal: the pipeline's two transfer groups have other members");
  // The group a transfer between this rank and `peer` goes over.
  auto over = [&](int64_t peer) -> comm::Group& { return peer < pipe.rank() ? down : pipe; };
  const int64_t me = pipe.rank();
  require(pipe.size() == s.pp, "internal: a schedule for ", s.pp, " pipeline ranks run on a group of ", pipe.size());
  using Clock = std::chrono::steady_clock;
  const Clock::time_point begin = Clock::now();
  if (started) *started = std::chrono::duration<double>(begin.time_since_epoch()).count();
  auto now = [&]() { return std::chrono::duration<double>(Clock::now() - begin).count(); };

  std::map<Key, at::Tensor> ready;  // inputs waiting for their consumer, received or handed over
  std::map<Key, std::pair<comm::Work, at::Tensor>> sends;  // posted, not yet waited
  const std::map<size_t, std::vector<Key>> arrived = arrived_sends(s, me);
  const std::vector<Action>& row = s.ranks[me];
  // The receive posted ahead: its index in the row (row.size(): none), Work and buffer.
  size_t posted_at = row.size();
  comm::Work posted;
  at::Tensor posted_buffer;
  auto post_next_receive = [&](size_t from) {
    for (posted_at = from; posted_at < row.size(); ++posted_at) {
      const Action& a = row[posted_at];
      if (a.op != Op::RecvF && a.op != Op::RecvB) continue;
      const bool forward = a.op == Op::RecvF;
      posted_buffer = work.receive_buffer(a);
      const int64_t peer = s.rank_of(forward ? a.stage - 1 : a.stage + 1);
      // The sender's group: a lower rank's sends come over pipe, a higher rank's over down.
      posted = (peer > me ? down : pipe)
                   .recv_async(posted_buffer, peer, transfer_tag(forward ? 0 : 1, a.stage, a.micro));
      if (work.receive_posted) work.receive_posted(a);
      return;
    }
  };

  std::vector<TimedAction> timeline;
  // Per stage: GATHER holds, and whether the first compute action since the fetch has waited for it.
  std::vector<int64_t> holds(static_cast<size_t>(s.stages()), 0);
  std::vector<char> awaited(static_cast<size_t>(s.stages()), 1);
  auto wait_sends = [&]() {
    for (auto& [key, send] : sends) send.first.wait();
    sends.clear();
  };
  auto take = [&](const Key& key, const Action& a) {
    const auto it = ready.find(key);
    require(it != ready.end(), "internal: pipeline rank ", me, " runs ", a.str(), " without its input");
    at::Tensor t = std::move(it->second);
    ready.erase(it);
    return t;
  };
  post_next_receive(0);
  for (size_t index = 0; index < row.size(); ++index) {
    const Action& a = row[index];
    double start = now();
    try {
      switch (a.op) {
        case Op::F:
        case Op::B:
        case Op::I:
        case Op::W: {
          const bool forward = a.op == Op::F;
          if (!awaited[a.stage]) {  // its stage's fetch: the wait is the GATHER's entry
            const double from = now();
            work.complete(a);
            start = now();
            timeline.push_back({Action{Op::Gather, a.stage, a.micro}, from, start});
            awaited[a.stage] = 1;
          }
          at::Tensor input;
          if (forward && a.stage > 0) input = take({0, a.stage, a.micro}, a);
          if ((a.op == Op::B || a.op == Op::I) && a.stage + 1 < s.stages()) input = take({1, a.stage, a.micro}, a);
          at::Tensor out = work.compute(a, input);
          if (forward && a.stage + 1 < s.stages()) ready[{0, a.stage + 1, a.micro}] = out;
          if ((a.op == Op::B || a.op == Op::I) && a.stage > 0) ready[{1, a.stage - 1, a.micro}] = out;
          timeline.push_back({a, start, now()});
          break;
        }
        case Op::SendF:
        case Op::SendB: {
          const bool forward = a.op == Op::SendF;
          const int64_t to_stage = forward ? a.stage + 1 : a.stage - 1;
          at::Tensor t = take({forward ? 0 : 1, to_stage, a.micro}, a).contiguous();
          const Key key{forward ? 0 : 1, to_stage, a.micro};
          sends[key] = {over(s.rank_of(to_stage)).send_async(t, s.rank_of(to_stage), transfer_tag(forward ? 0 : 1, to_stage, a.micro)), t};
          timeline.push_back({a, start, now()});
          break;
        }
        case Op::RecvF:
        case Op::RecvB: {
          require(posted_at == index, "internal: pipeline rank ", me, " reached ", a.str(), " without posting it");
          posted.wait();
          ready[{a.op == Op::RecvF ? 0 : 1, a.stage, a.micro}] = std::move(posted_buffer);
          timeline.push_back({a, start, now()});
          post_next_receive(index + 1);
          // The sends its sender took before sending it have arrived: their buffers go now.
          if (const auto it = arrived.find(index); it != arrived.end())
            for (const Key& key : it->second)
              if (const auto send = sends.find(key); send != sends.end()) {
                send->second.first.wait();
                sends.erase(send);
              }
          break;
        }
        case Op::Gather:
        case Op::Release:
        case Op::Optim: {
          require(static_cast<bool>(work.parameters), "internal: a pipeline table with ", a.str(),
                  " run without parameter actions");
          if (a.op == Op::Optim) wait_sends();
          work.parameters(a);
          if (a.op == Op::Gather && holds[a.stage]++ == 0) awaited[a.stage] = 0;
          if (a.op == Op::Release) holds[a.stage] -= 1;
          if (a.op == Op::Optim) timeline.push_back({a, start, now()});
          break;
        }
      }
    } catch (const Error& e) {
      if (a.op == Op::RecvF || a.op == Op::RecvB) {
        const int64_t from = a.op == Op::RecvF ? a.stage - 1 : a.stage + 1;
        fail("pipeline rank ", me, " (", s.name, "), action ", a.str(), ", waiting on pipeline rank ", s.rank_of(from),
             " (stage ", from, "): ", e.what());
      }
      fail("pipeline rank ", me, " (", s.name, "), action ", a.str(), ": ", e.what());
    }
  }
  try {
    wait_sends();
  } catch (const Error& e) {
    fail("pipeline rank ", me, " (", s.name, "), waiting for its sends at the end of the step: ", e.what());
  }
  return timeline;
}

double clock_offset(comm::Group& pipe, int rounds) {
  using Clock = std::chrono::steady_clock;
  auto now = []() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); };
  double offset = 0;
  for (int64_t r = 1; r < pipe.size(); ++r) {
    if (pipe.rank() != 0 && pipe.rank() != r) continue;
    // Rank 0 sends its clock t0; rank r answers with its receipt t1 and reply t2; rank 0 receives at
    // t3. Offset = ((t1 - t0) + (t2 - t3)) / 2, taken from the round with the least t3 - t0 - (t2 - t1).
    double best_round = 0, best = 0;
    for (int i = 0; i < rounds; ++i) {
      at::Tensor stamps = at::zeros({3}, at::kDouble);
      if (pipe.rank() == 0) {
        stamps[0] = now();
        pipe.send(stamps, r, 0);
        pipe.recv(stamps, r, 0);
        const double t3 = now();
        const auto t = stamps.accessor<double, 1>();
        const double round = (t3 - t[0]) - (t[2] - t[1]), estimate = ((t[1] - t[0]) + (t[2] - t3)) / 2;
        if (i == 0 || round < best_round) best_round = round, best = estimate;
      } else {
        pipe.recv(stamps, 0, 0);
        stamps[1] = now();
        stamps[2] = now();
        pipe.send(stamps, 0, 0);
      }
    }
    at::Tensor estimate = at::full({1}, best, at::kDouble);
    if (pipe.rank() == 0) {
      pipe.send(estimate, r, 0);
    } else {
      pipe.recv(estimate, 0, 0);
      offset = estimate.item<double>();
    }
  }
  return offset;
}

TransferCosts transfer_costs(const std::vector<std::vector<TimedAction>>& timelines, const std::vector<double>& started) {
  TransferCosts costs;
  std::map<std::tuple<Op, int64_t, int64_t>, double> posted;  // when each send was posted, common clock
  double send_sum = 0, post_sum = 0;
  int64_t sends = 0, posts = 0;
  for (size_t r = 0; r < timelines.size(); ++r) {
    const std::vector<TimedAction>& row = timelines[r];
    bool receives = false;
    for (size_t i = 0; i < row.size(); ++i) {
      const Op op = row[i].action.op;
      if (op == Op::SendF || op == Op::SendB) {
        posted[{op, row[i].action.stage, row[i].action.micro}] = started[r] + row[i].end;
        send_sum += row[i].end - row[i].start;
        sends += 1;
      }
      if ((op == Op::RecvF || op == Op::RecvB) && i + 1 < row.size()) {
        post_sum += row[i + 1].start - row[i].end;
        posts += 1;
      }
      receives = receives || op == Op::RecvF || op == Op::RecvB;
    }
    if (receives && !row.empty()) {
      post_sum += row.front().start;
      posts += 1;
    }
  }
  if (sends > 0) costs.send = send_sum / static_cast<double>(sends);
  if (posts > 0) costs.post = std::max(0.0, post_sum / static_cast<double>(posts));
  std::vector<double> samples;
  constexpr double kWaited = 50e-6;  // a receive that waited less found its data there
  for (size_t r = 0; r < timelines.size(); ++r)
    for (const TimedAction& t : timelines[r]) {
      if ((t.action.op != Op::RecvF && t.action.op != Op::RecvB) || t.end - t.start < kWaited) continue;
      const bool forward = t.action.op == Op::RecvF;
      const auto it = posted.find({forward ? Op::SendF : Op::SendB, t.action.stage + (forward ? -1 : 1), t.action.micro});
      if (it != posted.end()) samples.push_back(started[r] + t.end - it->second);
    }
  if (!samples.empty()) {
    std::nth_element(samples.begin(), samples.begin() + static_cast<std::ptrdiff_t>(samples.size() / 2), samples.end());
    costs.transfer = std::max(0.0, samples[samples.size() / 2]);
  }
  return costs;
}

std::vector<std::vector<TimedAction>> gather_timelines(comm::Group& pipe, const std::vector<TimedAction>& mine) {
  at::Tensor rows = at::full({1}, static_cast<int64_t>(mine.size()), at::kLong);
  pipe.all_reduce(rows, comm::ReduceOp::max);
  const int64_t n = rows.item<int64_t>();
  at::Tensor all = at::empty({pipe.size() * n, 5}, at::kDouble);
  pipe.all_gather(all, timeline_rows(mine, n));
  std::vector<std::vector<TimedAction>> out(pipe.size());
  for (int64_t r = 0; r < pipe.size(); ++r) {
    const at::Tensor rank_rows = all.narrow(0, r * n, n);
    const auto a = rank_rows.accessor<double, 2>();
    for (int64_t i = 0; i < n && a[i][0] >= 0; ++i) {
      TimedAction t;
      t.action = {static_cast<Op>(static_cast<int>(a[i][0])), static_cast<int64_t>(a[i][1]), static_cast<int64_t>(a[i][2])};
      t.start = a[i][3];
      t.end = a[i][4];
      out[r].push_back(t);
    }
  }
  return out;
}

}  // namespace tessera::pipeline
