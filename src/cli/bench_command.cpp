// `tessera bench`: times training steps of a config on synthetic tokens (no data directory
// needed), through the same TrainStep the trainer runs. Prints a table and, with --json, one JSON
// object that bench/compare_pytorch.py reads.
#include <algorithm>
#include <chrono>
#include <iostream>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "train/config.h"
#include "train/device_peak.h"
#include "train/train_step.h"

namespace tessera::cli {

Command add_bench_command(CLI::App& app) {
  struct Args {
    std::string config;
    std::vector<std::string> sets;
    int64_t steps = 5, warmup = 2;
    bool json = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("bench", "time training steps of a config on synthetic tokens");
  cmd->add_option("--config", args->config, "config file or preset name")->required();
  cmd->add_option("--set", args->sets, "override a config key: section.key=value (repeatable)")->take_all();
  cmd->add_option("--steps", args->steps, "timed steps")->capture_default_str();
  cmd->add_option("--warmup", args->warmup, "untimed steps first")->capture_default_str();
  cmd->add_flag("--json", args->json, "print one JSON object instead of a table");
  return [args]() {
    Config config = Config::load(args->config, args->sets);
    require(args->steps > 0 && args->warmup >= 0, "bench: --steps must be > 0 and --warmup >= 0");
    TrainStep step(config);
    const c10::Device device = step.device();
    at::Generator generator = at::detail::createCPUGenerator(1);
    std::vector<Batch> batches;
    for (int64_t i = 0; i < config.train.grad_accum; ++i) {
      at::Tensor tokens = at::randint(config.model.vocab_size, {config.train.batch_size, config.train.seq_len + 1},
                                      generator, at::TensorOptions().dtype(at::kLong));
      batches.push_back({tokens.narrow(1, 0, config.train.seq_len), tokens.narrow(1, 1, config.train.seq_len)});
    }
    std::vector<double> seconds;
    for (int64_t i = 0; i < args->warmup + args->steps; ++i) {
      auto start = std::chrono::steady_clock::now();
      step.run(batches, config.optim.lr);
      if (device.is_cuda()) torch::cuda::synchronize();
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (i >= args->warmup) seconds.push_back(s);
    }
    std::vector<double> sorted = seconds;
    std::sort(sorted.begin(), sorted.end());
    const double median = sorted[sorted.size() / 2];
    const double tokens = static_cast<double>(config.train.batch_size * config.train.seq_len * config.train.grad_accum);
    const DevicePeak peak = device_peak(device, step.compute_dtype(), config.train.peak_tflops);
    const double mfu = flops_per_token(config.model, config.train.seq_len) * tokens / median / peak.flops;
    nlohmann::json out = {{"peer", "tessera"},
                          {"parameters", parameter_count(config.model)},
                          {"tokens_per_step", tokens},
                          {"step_s", seconds},
                          {"median_step_s", median},
                          {"tokens_per_s", tokens / median},
                          {"mfu", mfu},
                          {"peak_flops", peak.flops},
                          {"peak_basis", peak.basis},
                          {"threads", at::get_num_threads()}};
    if (args->json) {
      std::cout << out.dump() << "\n";
      return 0;
    }
    std::printf("%12s %10s %14s %12s %8s\n", "params", "tokens/step", "median step s", "tokens/s", "MFU");
    std::printf("%11.2fM %10.0f %14.4f %12.0f %7.2f%%\n", parameter_count(config.model) / 1e6, tokens, median,
                tokens / median, 100 * mfu);
    std::printf("(MFU against %.3g TFLOP/s: %s)\n", peak.flops / 1e12, peak.basis.c_str());
    return 0;
  };
}

}  // namespace tessera::cli
