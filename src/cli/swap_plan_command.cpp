// `tessera swap-plan --config X [--set ...] [--actions] [--svg FILE]`: the swap plan a run with
// memory.swap = true would execute, without training: each block measured on train.device
// (plan/profile_cut.h: forward, backward, activation bytes), the cut the partitioner picks under
// memory.device_budget_gb (or memory.swap_blocks by hand), each sub-model's bytes and times, the
// device peak, the host memory the run needs, and the predicted step time and load overlap (the
// plan replayed: memory/swap/swap_simulate.h). --actions prints the action table with the
// device occupancy after each action; --svg draws the replayed timeline, one row per stream.
#include <cstdio>

#include "cli/commands.h"
#include "comm/device.h"
#include "core/byte_size.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/parallel_dims.h"
#include "memory/swap/swap_simulate.h"
#include "memory/swap/swap_timeline.h"
#include "parallel/layout_check.h"
#include "parallel/parallelize.h"
#include "plan/memory_estimate.h"
#include "plan/layout.h"
#include "plan/swap_cut.h"
#include "config/config.h"

namespace tessera::cli {

Command add_swap_plan_command(CLI::App& app) {
  struct Args {
    std::string config, svg;
    std::vector<std::string> sets;
    bool actions = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "swap-plan", "measure a swapped run's blocks on its device and print the swap plan, its device peak, host "
                   "memory and predicted step time");
  cmd->add_option("--config", args->config, "config file, or a preset name from configs/")->required();
  cmd->add_option("--set", args->sets, "override a config key: section.key=value (repeatable)")->take_all();
  cmd->add_flag("--actions", args->actions, "print the action table with the device occupancy after each action");
  cmd->add_option("--svg", args->svg, "write the replayed timeline (one row per stream) to this SVG file");
  return [args]() {
    Config config = Config::load(args->config, args->sets);
    require(config.memory.swap, config_source(args->config),
            ": memory.swap is false; swap-plan plans a swapped run (add --set memory.swap=true "
            "--set memory.device_budget_gb=...)");
    const ParallelDims dims(config.parallel, 1, config_source(args->config));
    check_layout_options(config, dims);
    const c10::Device device = comm::select_device(config.train.device, comm::LaunchInfo());
    std::printf("measuring %lld blocks on %s ...\n", static_cast<long long>(config.model.n_layer), device.str().c_str());
    const Layout layout = make_layout(config, dims, measure_layout(config, nullptr, device));
    const swap::SwapPlan& plan = layout.swap_plan();
    std::fputs(describe_swap_plan(plan).c_str(), stdout);
    const SwapHostMemory host = swap_host_memory(config, plan);
    std::printf("  host memory: %s (masters %s, gradients %s, staging %s, bf16 copies %s, optimizer %s%s); "
                "available %s\n", format_bytes(host.total()).c_str(), format_bytes(host.masters).c_str(),
                format_bytes(host.gradients).c_str(), format_bytes(host.staging).c_str(),
                format_bytes(host.copies).c_str(),
                format_bytes(host.optimizer).c_str(),
                host.device > 0 ? (", the CPU device " + format_bytes(host.device)).c_str() : "",
                format_bytes(host_memory_available()).c_str());
    if (args->actions) std::fputs(swap::format_swap_plan(plan).c_str(), stdout);
    if (!args->svg.empty()) {
      const swap::SwapTimeline t = swap::simulate_swap_plan(plan);
      char title[200];
      std::snprintf(title, sizeof title, "swap plan replayed: %lld sub-models, step %.1f ms, %.0f%% of loading hidden",
                    static_cast<long long>(plan.size()), 1000 * t.step_time, 100 * t.overlap());
      write_file_durable(args->svg, swap::swap_timeline_svg(t.actions, title));
      std::printf("timeline: %s\n", args->svg.c_str());
    }
    return 0;
  };
}

}  // namespace tessera::cli
