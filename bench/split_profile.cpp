// tessera_split_profile: what a pipeline stage's backward costs whole (B, as 1F1B runs it) and cut
// into the zero-bubble schedules' halves (I then W, parallel/pipeline/split_backward.h), measured on
// one process so that nothing else shares its core. Builds blocks [--first, --end) of the configured
// model (a middle chunk: no embedding, no head), then runs, in rounds whose variants are interleaved:
//   B         a forward, then torch::autograd::backward of the blocks' output (the pipeline's B);
//   I+W       a forward, SplitBackward's I, then its W at once;
//   deferred  --deferred M forwards, then their M B's; and M forwards, their M I's, then their M W's
//             (each backward a few micro-batches after its forward, as in a schedule's steady
//             state, and W deferred, as ZB-V defers it).
// Default: the calling thread's CPU milliseconds per micro-batch of each part (median over rounds;
// with train.threads = 1 this is the work itself). --ops: per-op self time per micro-batch of B, I
// and W side by side (bench/op_recorder.h; its callbacks add their own cost to every op), sorted by
// how much more I + W spends on the op than B.
//
// Invariant: --warmup rounds run unobserved; parameters' gradients accumulate over the run as they
// do over a pipeline step's micro-batches.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <ATen/ops/randn.h>
#include <torch/csrc/autograd/autograd.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "config/config.h"
#include "core/host_heap.h"
#include "model/transformer.h"
#include "op_recorder.h"
#include "thread_timing.h"
#include "parallel/pipeline/split_backward.h"

namespace {

using tessera::bench::median;
using tessera::bench::OpStat;
using tessera::bench::thread_cpu_s;
using Ops = std::map<std::string, OpStat>;

void add(Ops& into, const Ops& from) {
  for (const auto& [name, s] : from) {
    OpStat& t = into[name];
    t.calls += s.calls;
    t.self_us += s.self_us;
    t.total_us += s.total_us;
  }
}

// One micro-batch's forward through the chunk: its input (a leaf, as a middle stage receives it),
// its output and the output's gradient (as the next stage would send it).
struct Pass {
  at::Tensor input, output, grad;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"B against I + W of one pipeline chunk, per op (bench/split_profile.cpp)"};
  std::string config_name = "tiny_gpt";
  std::vector<std::string> sets;
  int64_t first = 2, end = 4, rounds = 20, warmup = 3, deferred = 4;
  bool ops = false;
  app.add_option("--config", config_name, "config file or preset name")->capture_default_str();
  app.add_option("--set", sets, "override a config key: section.key=value (repeatable)")->take_all();
  app.add_option("--first", first, "the chunk's first block")->capture_default_str();
  app.add_option("--end", end, "one past the chunk's last block")->capture_default_str();
  app.add_option("--rounds", rounds, "observed rounds")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "unobserved rounds first")->capture_default_str();
  app.add_option("--deferred", deferred, "micro-batches whose W waits for all their I's")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_flag("--ops", ops, "print per-op self time of B, I and W instead of CPU time per part");
  CLI11_PARSE(app, argc, argv);

  const tessera::Config config = tessera::Config::load(config_name, sets);
  tessera::keep_host_heap();  // as TrainStep does
  if (config.train.threads > 0) at::set_num_threads(static_cast<int>(config.train.threads));
  const tessera::ModelOptions& o = config.model;
  tessera::TransformerLM model(o, tessera::ModelStage(first, end));
  model->train();
  std::vector<at::Tensor> params = model->parameters();
  const int64_t b = config.train.batch_size, t = config.train.seq_len;

  auto forward = [&] {
    Pass p;
    p.input = at::randn({b, t, o.n_embd}).requires_grad_(true);
    p.output = model->run_blocks(p.input).x;
    p.grad = at::randn(p.output.sizes());
    return p;
  };
  auto split = [&](const Pass& p) { return tessera::pipeline::SplitBackward({p.output}, {p.grad}, p.input, params); };

  // Per part, the CPU ms of each observed round (per micro-batch), or the ops recorded.
  std::map<std::string, std::vector<double>> ms;
  std::map<std::string, Ops> recorded;
  std::unique_ptr<tessera::bench::OpRecorder> recorder;
  auto timed = [&](const std::string& part, bool observe, double per, const auto& fn) {
    if (observe && ops) recorder->take();
    const double c0 = 1e3 * thread_cpu_s();
    fn();
    const double spent = 1e3 * thread_cpu_s() - c0;
    if (!observe) return;
    if (ops) add(recorded[part], recorder->take());
    else ms[part].push_back(spent / per);
  };

  for (int64_t round = 0; round < warmup + rounds; ++round) {
    const bool observe = round >= warmup;
    if (observe && ops && !recorder) recorder = std::make_unique<tessera::bench::OpRecorder>();
    {
      Pass p = forward();
      timed("B", observe, 1, [&] { torch::autograd::backward({p.output}, {p.grad}); });
    }
    {
      Pass p = forward();
      std::optional<tessera::pipeline::SplitBackward> s;
      timed("I", observe, 1, [&] { s.emplace(split(p)); });
      p = Pass{};  // the pipeline drops the graph after I (what W needs is the split's)
      timed("W", observe, 1, [&] { s->weight_gradients(); });
    }
    {
      std::vector<Pass> passes;
      for (int64_t m = 0; m < deferred; ++m) passes.push_back(forward());
      timed("B deferred", observe, static_cast<double>(deferred), [&] {
        for (const Pass& p : passes) torch::autograd::backward({p.output}, {p.grad});
      });
    }
    {
      std::vector<Pass> passes;
      std::vector<tessera::pipeline::SplitBackward> s;
      for (int64_t m = 0; m < deferred; ++m) passes.push_back(forward());
      const double per = static_cast<double>(deferred);
      timed("I deferred", observe, per, [&] {
        for (const Pass& p : passes) s.push_back(split(p));
      });
      passes.clear();
      timed("W deferred", observe, per, [&] {
        for (auto& split_backward : s) split_backward.weight_gradients();
      });
    }
  }
  recorder.reset();

  const double n = static_cast<double>(rounds);
  if (!ops) {
    nlohmann::json out = {{"chunk", std::to_string(first) + "-" + std::to_string(end - 1)},
                          {"threads", at::get_num_threads()}};
    for (const auto& [part, v] : ms) out[part + " ms"] = median(v);
    out["I+W / B"] = (median(ms["I"]) + median(ms["W"])) / median(ms["B"]);
    out["deferred I+W / B"] = (median(ms["I deferred"]) + median(ms["W deferred"])) / median(ms["B deferred"]);
    std::cout << out.dump() << "\n";
    return 0;
  }
  std::set<std::string> names;
  for (const auto& [part, r] : recorded)
    for (const auto& [name, s] : r) names.insert(name);
  auto stat = [&](const std::string& part, const std::string& name) {
    const auto it = recorded[part].find(name);
    return it == recorded[part].end() ? OpStat{} : it->second;
  };
  auto self = [&](const std::string& part, const std::string& name) { return stat(part, name).self_us / n; };
  auto calls = [&](const std::string& part, const std::string& name) {
    return static_cast<double>(stat(part, name).calls) / n;
  };
  std::vector<std::string> rows(names.begin(), names.end());
  auto extra = [&](const std::string& name) { return self("I", name) + self("W", name) - self("B", name); };
  std::sort(rows.begin(), rows.end(), [&](const auto& a, const auto& b) { return extra(a) > extra(b); });
  std::printf("self us per micro-batch (calls), blocks %ld-%ld, %d threads\n", static_cast<long>(first),
              static_cast<long>(end - 1), at::get_num_threads());
  std::printf("%-44s %16s %16s %16s %10s\n", "op", "B", "I", "W", "I+W-B");
  double total[3] = {0, 0, 0};
  for (const std::string& name : rows) {
    std::printf("%-44s %9.1f (%4.0f) %9.1f (%4.0f) %9.1f (%4.0f) %10.1f\n", name.c_str(), self("B", name),
                calls("B", name), self("I", name), calls("I", name), self("W", name), calls("W", name), extra(name));
    total[0] += self("B", name);
    total[1] += self("I", name);
    total[2] += self("W", name);
  }
  std::printf("%-44s %16.1f %16.1f %16.1f %10.1f\n", "total", total[0], total[1], total[2],
              total[1] + total[2] - total[0]);
  return 0;
}
