// `tessera inspect --config X [--set ...] [--world N]`: what a configured run is, without running
// it or allocating it: the model's parameters counted from its own modules on the meta device, by
// component, and the memory one rank holds under the configured layout (plan/memory_estimate.h).
// The layout is checked by the one validator first (check_layout_options: everything but this
// machine's build, since a plan is often for another machine), so a layout that cannot run is
// refused here as it would be by `tessera train`.
#include <cstdio>

#include "cli/commands.h"
#include "core/error.h"
#include "core/parallel_dims.h"
#include "parallel/parallelize.h"
#include "plan/memory_estimate.h"
#include "train/config.h"

namespace tessera::cli {
namespace {

std::string bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  char out[32];
  std::snprintf(out, sizeof(out), "%.2f %s", b, units[u]);
  return out;
}

std::string count(int64_t n) {
  char out[32];
  if (n >= 1000000000)
    std::snprintf(out, sizeof(out), "%.2fB", static_cast<double>(n) / 1e9);
  else if (n >= 1000000)
    std::snprintf(out, sizeof(out), "%.2fM", static_cast<double>(n) / 1e6);
  else
    std::snprintf(out, sizeof(out), "%lld", static_cast<long long>(n));
  return out;
}

}  // namespace

Command add_inspect_command(CLI::App& app) {
  struct Args {
    std::string config;
    std::vector<std::string> sets;
    int64_t world = 0;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("inspect", "print a config's parameter count and per-rank memory, allocating nothing");
  cmd->add_option("--config", args->config, "config file, or a preset name from configs/ (e.g. gpt2_124m)")->required();
  cmd->add_option("--set", args->sets, "override a config key: section.key=value (repeatable)")->take_all();
  cmd->add_option("--world", args->world,
                  "ranks of the run (default: the product of the parallel degrees, with dp = 1 when it is 0)");
  return [args]() {
    const Config config = Config::load(args->config, args->sets);
    const ParallelOptions& p = config.parallel;
    const int64_t world = args->world > 0 ? args->world : std::max<int64_t>(p.dp, 1) * p.tp * p.pp * p.sp;
    const ParallelDims dims(p, world, resolve_config_path(args->config));
    check_layout_options(config, dims);
    const ModelOptions& m = config.model;
    const MemoryEstimate e = estimate_memory(config, dims);
    std::printf("model: arch %s, ffn %s, %lld blocks, n_embd %lld, %lld heads, vocab %lld, block_size %lld\n",
                m.arch.c_str(), m.ffn.c_str(), static_cast<long long>(m.n_layer), static_cast<long long>(m.n_embd),
                static_cast<long long>(m.n_head), static_cast<long long>(m.vocab_size),
                static_cast<long long>(m.block_size));
    std::printf("parameters: %s (%lld)", count(e.parameters_total).c_str(), static_cast<long long>(e.parameters_total));
    for (const auto& [component, n] : e.parameters_by_component) std::printf(", %s %s", component.c_str(), count(n).c_str());
    std::printf("; the head is tied to the token embedding\n");
    std::printf("layout: %s, zero_stage %lld%s, precision %s, optimizer %s, activation checkpointing %s\n",
                dims.describe().c_str(), static_cast<long long>(p.zero_stage), p.offload ? " with offload" : "",
                config.precision.dtype.c_str(), config.optim.name.c_str(), config.memory.activation_checkpointing.c_str());
    std::printf("per rank (%s parameters after tensor/expert parallelism):\n", count(e.parameters_rank).c_str());
    std::printf("  parameters       %12s\n", bytes(e.parameter_bytes).c_str());
    std::printf("  gradients        %12s\n", bytes(e.gradient_bytes).c_str());
    std::printf("  optimizer state  %12s%s\n", bytes(e.optimizer_bytes).c_str(), e.optimizer_on_host ? " (host)" : "");
    std::printf("  activations      %12s per micro-batch of %lld x %lld tokens (%s per token)\n",
                bytes(e.activation_bytes_per_micro_batch).c_str(), static_cast<long long>(config.train.batch_size),
                static_cast<long long>(config.train.seq_len / dims.sp()),
                bytes(e.activation_bytes_per_token).c_str());
    std::printf("  device total     %12s\n", bytes(e.device_bytes()).c_str());
    return 0;
  };
}

}  // namespace tessera::cli
