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
#include "parallel/layout_check.h"
#include "parallel/parallelize.h"
#include "plan/memory_estimate.h"
#include "config/config.h"

namespace tessera::cli {

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
    const ParallelDims dims(p, world, config_source(args->config));
    check_layout_options(config, dims);
    std::fputs(describe_memory_estimate(config, dims, estimate_memory(config, make_layout(config, dims))).c_str(), stdout);
    return 0;
  };
}

}  // namespace tessera::cli
