// Sleep-driven schedule measurement (measure.h).
#include "parallel/pipeline/measure.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

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

}  // namespace

MeasuredSchedule measure_schedule(const Schedule& s, comm::Group& pipe, comm::Group& down, const ActionCosts& costs,
                                  double unit_s) {
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
  // A fetch "completes" `gather` after it starts, after the rank's earlier ones (simulate.h).
  using Clock = std::chrono::steady_clock;
  std::vector<Clock::time_point> fetched(static_cast<size_t>(s.stages()));
  std::vector<int64_t> holds(static_cast<size_t>(s.stages()), 0);
  Clock::time_point fetching = Clock::now();
  const auto gather = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(costs.gather * unit_s));
  work.parameters = [&](const Action& a) {
    if (a.op == Op::Gather && holds[a.stage]++ == 0)
      fetching = fetched[a.stage] = std::max(Clock::now(), fetching) + gather;
    if (a.op == Op::Release) holds[a.stage] -= 1;
    if (a.op == Op::Optim) std::this_thread::sleep_for(std::chrono::duration<double>(costs.optim * unit_s));
  };
  work.complete = [&](const Action& a) { std::this_thread::sleep_until(fetched[a.stage]); };
  pipe.barrier();
  const std::vector<TimedAction> mine = run_schedule(s, pipe, down, work);
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
  result.timeline = gather_timelines(pipe, mine);
  return result;
}

}  // namespace tessera::pipeline
