// tessera_profile_step: where the time of `tessera bench`'s training step goes, for diffing against
// the PyTorch twin (bench/profile_pytorch_twin.py). Runs TrainStep::run on the same synthetic tokens as
// `tessera bench` (same --config/--set), then, over the timed steps, either
//   (default) records every ATen op and autograd node through at::RecordFunction: calls per step,
//             self time (its own time minus that of the ops it called) and total time per op name,
//             printed sorted by self time, or with --json as {name: {calls, self_us, total_us}};
//   --timing  records nothing and prints one JSON object: the calling thread's CPU seconds per step
//             (min, median; with train.threads=1 this is the step's work, insensitive to other
//             processes on a shared machine), wall seconds per step, and minor page faults per step;
//   --trace F records the timed steps with the Kineto profiler (host ops and, on CUDA, every kernel
//             and copy on the device) and writes them as a Chrome trace to F, which
//             bench/trace_summary.py sums into device time per kernel and the device's idle time.
// Both modes report the process's minor page faults per step (getrusage), the number that exposed
// glibc returning the heap to the kernel between steps (docs/benchmarks.md).
//
// Invariant: warmup steps run unobserved, so first-call initialisation never enters the numbers.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/cuda.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "config/config.h"
#include "op_recorder.h"
#include "thread_timing.h"
#include "train/train_step.h"

namespace {

using Clock = std::chrono::steady_clock;
using tessera::bench::median;
using tessera::bench::thread_cpu_s;

int64_t minor_faults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"per-op profile of tessera's training step (bench/profile_step.cpp)"};
  std::string config_name;
  std::vector<std::string> sets;
  int64_t steps = 10, warmup = 3;
  bool json = false, timing = false;
  std::string trace;
  app.add_option("--config", config_name, "config file or preset name")->required();
  app.add_option("--set", sets, "override a config key: section.key=value (repeatable)")->take_all();
  app.add_option("--steps", steps, "observed steps")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "unobserved steps first")->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_flag("--json", json, "print {op: {calls, self_us, total_us}} per step as one JSON object");
  app.add_flag("--timing", timing, "record no ops; print CPU and wall seconds and page faults per step");
  app.add_option("--trace", trace, "write the timed steps' Kineto trace (host and device) to this JSON file");
  CLI11_PARSE(app, argc, argv);

  const tessera::Config config = tessera::Config::load(config_name, sets);
  tessera::TrainStep step(config);
  at::Generator generator = at::detail::createCPUGenerator(1);
  std::vector<tessera::Batch> batches;
  for (int64_t i = 0; i < config.train.grad_accum; ++i) {
    at::Tensor tokens = at::randint(config.model.vocab_size, {config.train.batch_size, config.train.seq_len + 1},
                                    generator, at::TensorOptions().dtype(at::kLong));
    batches.push_back({tokens.narrow(1, 0, config.train.seq_len), tokens.narrow(1, 1, config.train.seq_len)});
  }
  for (int64_t i = 0; i < warmup; ++i) step.run(batches, config.optim.lr);
  if (step.device().is_cuda()) torch::cuda::synchronize();
  const double n = static_cast<double>(steps);

  if (!trace.empty()) {
    namespace prof = torch::profiler::impl;
    const prof::ProfilerConfig kineto(prof::ProfilerState::KINETO);
    std::set<prof::ActivityType> activities = {prof::ActivityType::CPU};
    if (step.device().is_cuda()) activities.insert(prof::ActivityType::CUDA);
    torch::autograd::profiler::prepareProfiler(kineto, activities);
    torch::autograd::profiler::enableProfiler(kineto, activities);
    const auto start = Clock::now();
    for (int64_t i = 0; i < steps; ++i) step.run(batches, config.optim.lr);
    if (step.device().is_cuda()) torch::cuda::synchronize();
    const double wall_s = std::chrono::duration<double>(Clock::now() - start).count();
    torch::autograd::profiler::disableProfiler()->save(trace);
    std::cout << nlohmann::json{{"peer", "tessera"}, {"trace", trace}, {"steps", steps}, {"wall_s_per_step", wall_s / n}}
                     .dump()
              << "\n";
    return 0;
  }

  if (timing) {
    std::vector<double> cpu, wall;
    const int64_t faults0 = minor_faults();
    for (int64_t i = 0; i < steps; ++i) {
      const double c0 = thread_cpu_s();
      const auto w0 = Clock::now();
      step.run(batches, config.optim.lr);
      cpu.push_back(thread_cpu_s() - c0);
      wall.push_back(std::chrono::duration<double>(Clock::now() - w0).count());
    }
    const double faults = static_cast<double>(minor_faults() - faults0) / n;
    std::cout << nlohmann::json{{"peer", "tessera"},
                                {"threads", at::get_num_threads()},
                                {"cpu_s_min", *std::min_element(cpu.begin(), cpu.end())},
                                {"cpu_s_median", median(cpu)},
                                {"wall_s_min", *std::min_element(wall.begin(), wall.end())},
                                {"wall_s_median", median(wall)},
                                {"page_faults_per_step", faults}}
                     .dump()
              << "\n";
    return 0;
  }

  std::map<std::string, tessera::bench::OpStat> stats;
  const int64_t faults0 = minor_faults();
  const auto start = Clock::now();
  {
    tessera::bench::OpRecorder recorder;
    for (int64_t i = 0; i < steps; ++i) step.run(batches, config.optim.lr);
    stats = recorder.take();
  }
  const double wall_us = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
  const double faults = static_cast<double>(minor_faults() - faults0) / n;

  std::vector<std::pair<std::string, tessera::bench::OpStat>> rows(stats.begin(), stats.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.self_us > b.second.self_us; });
  if (json) {
    nlohmann::json ops = nlohmann::json::object();
    for (const auto& [name, s] : rows)
      ops[name] = {{"calls", s.calls / n}, {"self_us", s.self_us / n}, {"total_us", s.total_us / n}};
    std::cout << nlohmann::json{{"peer", "tessera"},
                                {"step_us", wall_us / n},
                                {"threads", at::get_num_threads()},
                                {"page_faults_per_step", faults},
                                {"ops", ops}}
                     .dump()
              << "\n";
    return 0;
  }
  std::printf("step %.1f us while recording, %d threads, %.0f minor page faults; per step:\n", wall_us / n,
              at::get_num_threads(), faults);
  std::printf("%-60s %8s %12s %12s\n", "op", "calls", "self us", "total us");
  for (const auto& [name, s] : rows)
    std::printf("%-60s %8.1f %12.1f %12.1f\n", name.c_str(), s.calls / n, s.self_us / n, s.total_us / n);
  return 0;
}
