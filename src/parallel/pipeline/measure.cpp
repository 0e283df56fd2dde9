// Sleep-driven schedule measurement (measure.h).
#include "parallel/pipeline/measure.h"

#include <chrono>
#include <thread>

#include <ATen/ATen.h>

#include "core/error.h"
#include "parallel/pipeline/executor.h"

namespace tessera::pipeline {
namespace {

at::Tensor payload(int64_t stage, int64_t micro, int64_t direction) {
  return at::tensor({static_cast<double>(stage), static_cast<double>(micro), static_cast<double>(direction)}, at::kDouble);
}

void expect_payload(const at::Tensor& got, int64_t stage, int64_t micro, int64_t direction, const Action& at_action) {
  require(got.defined() && got.numel() == 3, "pipeline action ", at_action.str(), " got no input");
  const auto g = got.accessor<double, 1>();
  require(g[0] == stage && g[1] == micro && g[2] == direction, "pipeline action ", at_action.str(), " received the ",
          direction ? "gradient" : "activation", " of stage ", g[0], ", micro-batch ", g[1], " (direction ", g[2],
          "), expected stage ", stage, ", micro-batch ", micro, " (direction ", direction, ")");
}

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

MeasuredSchedule measure_schedule(const Schedule& s, comm::Group& pipe, const ActionCosts& costs, double unit_s) {
  StageWork work;
  work.compute = [&](const Action& a, const at::Tensor& input) {
    if (a.op == Op::F && a.stage > 0) expect_payload(input, a.stage - 1, a.micro, 0, a);
    if ((a.op == Op::B || a.op == Op::I) && a.stage + 1 < s.stages()) expect_payload(input, a.stage + 1, a.micro, 1, a);
    const double seconds = costs.of(a.op) * unit_s;
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
    if (a.op == Op::W) return at::Tensor();
    return payload(a.stage, a.micro, a.op == Op::F ? 0 : 1);
  };
  work.receive_buffer = [](const Action&) { return at::empty({3}, at::kDouble); };
  pipe.barrier();
  const std::vector<TimedAction> mine = run_schedule(s, pipe, work);
  // Busy: the compute actions as they ran (a sleep's overshoot is work, not bubble).
  double busy = 0;
  for (const TimedAction& t : mine)
    if (t.action.is_compute()) busy += t.end - t.start;
  MeasuredSchedule result;
  at::Tensor totals = at::tensor({mine.empty() ? 0.0 : mine.back().end, busy}, at::kDouble);
  at::Tensor end = totals.narrow(0, 0, 1).clone(), busy_sum = totals.narrow(0, 1, 1).clone();
  pipe.all_reduce(end, comm::ReduceOp::max);
  pipe.all_reduce(busy_sum, comm::ReduceOp::sum);
  result.step_time = end.item<double>();
  result.bubble = 1 - busy_sum.item<double>() / (static_cast<double>(s.pp) * result.step_time);
  // Every rank's timeline on rank 0 (padded to the longest).
  at::Tensor rows = at::full({1}, static_cast<int64_t>(mine.size()), at::kLong);
  pipe.all_reduce(rows, comm::ReduceOp::max);
  const int64_t n = rows.item<int64_t>();
  at::Tensor all = at::empty({s.pp * n, 5}, at::kDouble);
  pipe.all_gather(all, timeline_rows(mine, n));
  result.timeline.resize(s.pp);
  for (int64_t r = 0; r < s.pp; ++r) {
    const at::Tensor rank_rows = all.narrow(0, r * n, n);
    const auto a = rank_rows.accessor<double, 2>();
    for (int64_t i = 0; i < n && a[i][0] >= 0; ++i) {
      TimedAction t;
      t.action = {static_cast<Op>(static_cast<int>(a[i][0])), static_cast<int64_t>(a[i][1]), static_cast<int64_t>(a[i][2])};
      t.start = a[i][3];
      t.end = a[i][4];
      result.timeline[r].push_back(t);
    }
  }
  return result;
}

}  // namespace tessera::pipeline
