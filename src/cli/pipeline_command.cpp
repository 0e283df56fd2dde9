// `tessera pipeline`: builds (or reads) a pipeline schedule, validates it, replays it with
// per-action costs and prints the table, the step time, the bubble against the schedule's
// formula and the peak of held activations per rank; --svg draws the timeline. No model runs.
// --zero3 step|action adds ZeRO-3's GATHER/RELEASE (and the optimizer step) as a training run at
// parallel.zero_stage 3 has them, and prints the most stages each rank holds whole.
// --measure MS runs the table on pp local processes (Gloo) whose compute actions sleep their cost
// x MS milliseconds (parallel/pipeline/measure.h) and prints the measured bubble beside the
// simulated one (--svg then also draws the measured timeline, FILE.measured.svg).
// --model CONFIG [--set k=v ...] prices the table with a model's measured costs instead: it
// profiles the config's blocks on this process (plan/profile_cut.h: F, B, I and W of each block and
// of the ends, on its train.device), cuts the model as a run with that config, --pp, --schedule and
// --microbatches would, and prints each stage's measured F, B, I, W and the predicted step
// (seconds); zbv's and zbh1's tables are built for those costs (schedule_builders.h).
#include <cstdio>
#include <filesystem>
#include <unistd.h>
#include <fstream>
#include <sstream>

#include "cli/commands.h"
#include "cli/launcher.h"
#include "comm/device.h"
#include "comm/mesh.h"
#include "comm/rendezvous.h"
#include "core/error.h"
#include "core/fs.h"
#include "parallel/pipeline/measure.h"
#include "parallel/pipeline/schedule_builders.h"
#include "parallel/pipeline/simulate.h"
#include "parallel/pipeline/timeline_svg.h"
#include "parallel/pipeline/validate.h"
#include "plan/layout.h"
#include "plan/profile_cut.h"

namespace tessera::cli {
namespace {

using namespace tessera::pipeline;

// "f=1,b=2,i=1,w=1,transfer=0.1,gather=0.5,optim=1" -> costs (keys may be left out).
ActionCosts parse_costs(const std::string& text) {
  ActionCosts costs;
  std::stringstream items(text);
  std::string item;
  while (std::getline(items, item, ',')) {
    const auto eq = item.find('=');
    require(eq != std::string::npos, "--costs: '", item, "' is not key=value (keys f, b, i, w, transfer, gather, optim)");
    const std::string key = item.substr(0, eq);
    double value = 0;
    try {
      value = std::stod(item.substr(eq + 1));
    } catch (const std::exception&) {
      fail("--costs: '", item, "' has no number after '='");
    }
    require(value >= 0 && value < 1e9, "--costs: ", key, " = ", value, " must be in [0, 1e9)");
    if (key == "f") costs.f = value;
    else if (key == "b") costs.b = value;
    else if (key == "i") costs.i = value;
    else if (key == "w") costs.w = value;
    else if (key == "transfer") costs.transfer = value;
    else if (key == "gather") costs.gather = value;
    else if (key == "optim") costs.optim = value;
    else fail("--costs: unknown key '", key, "' (f, b, i, w, transfer, gather, optim)");
  }
  return costs;
}

// The schedule's bubble by its formula for unit costs, or a negative value where it has none.
double formula_bubble(const Schedule& s) {
  const double p = static_cast<double>(s.pp), m = static_cast<double>(s.micro_batches), v = static_cast<double>(s.v);
  if (s.name == "gpipe" || s.name == "1f1b") return (p - 1) / (m + p - 1);
  if (s.name == "interleaved") return (p - 1) / (v * m + p - 1);
  if (s.name == "zbh1" && m >= p) return (p - 1) / (3 * m + p - 1);
  if (s.name == "zbv" && m >= p) return (p - 1) / (6 * m + p - 1);
  return -1;
}

}  // namespace

Command add_pipeline_command(CLI::App& app) {
  struct Args {
    std::string schedule = "1f1b", costs, svg, csv, zero3 = "none", model;
    std::vector<std::string> sets;
    int64_t pp = 4, microbatches = 8, virtual_stages = 0;
    double measure_ms = 0;
    bool vee = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("pipeline", "print, check, simulate and draw a pipeline schedule (no model runs)");
  cmd->add_option("--schedule", args->schedule,
                  "gpipe, 1f1b, interleaved, zbh1, zbv, dualpipev, or file:PATH (a CSV table)")
      ->capture_default_str();
  cmd->add_option("--pp", args->pp, "pipeline ranks")->capture_default_str();
  cmd->add_option("--microbatches", args->microbatches, "micro-batches per step")->capture_default_str();
  cmd->add_option("--virtual", args->virtual_stages,
                  "stages per rank (default: 2 for interleaved, zbv and dualpipev, else 1)");
  cmd->add_flag("--vee", args->vee, "with file:PATH, V placement (rank 0 holds the first and last stage)");
  cmd->add_option("--costs", args->costs,
                  "action costs, e.g. f=1,b=2,i=1,w=1,transfer=0,gather=0,optim=0 (the defaults); zbv's and zbh1's tables are built for them");
  cmd->add_option("--zero3", args->zero3,
                  "none, or ZeRO-3's GATHER/RELEASE per step or per action (parallel.zero3_reshard_per_microbatch), "
                  "with the optimizer step")
      ->check(CLI::IsMember({"none", "step", "action"}))
      ->capture_default_str();
  cmd->add_option("--svg", args->svg, "draw the simulated timeline to this SVG file");
  cmd->add_option("--csv", args->csv, "write the table (with its communication) to this CSV file");
  cmd->add_option("--measure", args->measure_ms,
                  "also run the table on pp local processes whose actions sleep cost x this many milliseconds");
  cmd->add_option("--model", args->model,
                  "a config file or preset: profile its blocks here and price each stage with its measured F, I, W "
                  "(seconds)");
  cmd->add_option("--set", args->sets, "with --model, override a config key: section.key=value (repeatable)")
      ->take_all();
  return [args]() {
    require(args->pp >= 1 && args->pp <= 4096, "--pp must be in [1, 4096] (got ", args->pp, ")");
    require(args->microbatches >= 1 && args->microbatches <= 65536, "--microbatches must be in [1, 65536] (got ",
            args->microbatches, ")");
    const bool from_file = args->schedule.rfind("file:", 0) == 0;
    ParallelOptions layout;  // its default stages per rank for the schedule
    layout.pp_schedule = args->schedule;
    const int64_t v = args->virtual_stages > 0 ? args->virtual_stages : (args->vee ? 2 : layout.pipeline_virtual());
    ActionCosts costs = parse_costs(args->costs);
    const comm::LaunchInfo launch = comm::launch_info_from_environment();
    if (!args->model.empty()) {
      require(!from_file && args->measure_ms == 0 && args->zero3 == "none",
              "--model prices a built-in --schedule with measured seconds: not with file:, --measure or --zero3");
      std::vector<std::string> sets = args->sets;
      for (const std::string& set : {"parallel.pp=" + std::to_string(args->pp), "parallel.pp_schedule=" + args->schedule,
                                     "train.grad_accum=" + std::to_string(args->microbatches), std::string("train.global_batch_size=0")})
        sets.push_back(set);
      if (args->virtual_stages > 0) sets.push_back("parallel.pp_virtual=" + std::to_string(args->virtual_stages));
      const Config config = Config::load(args->model, sets);
      const ParallelOptions& p = config.parallel;
      const ParallelDims dims(p, p.pp * p.tp * p.sp, config_source(args->model));
      LayoutMeasurements measured;
      measured.blocks = profile_blocks(config, comm::select_device(config.train.device, launch));
      const Layout layout = make_layout(config, dims, measured);
      std::printf("%s\n", describe_layout(config, layout).c_str());
      costs.stages = layout.cut().compute;
    }
    Schedule s = from_file ? read_schedule_csv(args->schedule.substr(5), args->pp, v, args->microbatches,
                                               args->vee ? Placement::vee : Placement::loop)
                           : build_schedule(args->schedule, args->pp, args->microbatches, v, costs);
    if (args->zero3 != "none") add_parameter_actions(s, args->zero3 == "step" ? Gathers::per_step : Gathers::per_action);
    validate_schedule(s);
    const Simulation sim = simulate_schedule(s, costs);
    if (args->measure_ms > 0 && launch.launcher != "tessera") {
      require(args->measure_ms <= 10000, "--measure must be at most 10000 ms per unit of cost (got ", args->measure_ms, ")");
      LaunchOptions workers;
      workers.nproc = static_cast<int>(args->pp);
      const std::string logs = (std::filesystem::temp_directory_path() / ("tessera-pipeline-" + std::to_string(::getpid()))).string();
      const int code = launch_workers(workers, logs, 10);
      std::filesystem::remove_all(logs);
      return code;
    }
    MeasuredSchedule measured;
    if (args->measure_ms > 0) {
      ParallelOptions options;
      options.pp = s.pp;
      const std::unique_ptr<comm::Mesh> mesh =
          comm::Mesh::connect(launch, ParallelDims(options, launch.world_size, "tessera pipeline"), options, c10::Device(c10::kCPU));
      measured = measure_schedule(s, mesh->group("pp"), mesh->group("pp_down"), costs, args->measure_ms / 1000);
      if (launch.rank != 0) return 0;
    }
    std::printf("%s: pp %lld, %lld stage(s) per rank, %lld micro-batches (compute and parameter actions; <stage><op><micro-batch>)\n%s",
                s.name.c_str(), static_cast<long long>(s.pp), static_cast<long long>(s.v),
                static_cast<long long>(s.micro_batches), format_grid(s).c_str());
    if (costs.stages.empty())
      std::printf("costs: F %g, B %g, I %g, W %g, transfer %g, gather %g, optim %g\n", costs.f, costs.b, costs.i,
                  costs.w, costs.transfer, costs.gather, costs.optim);
    else
      std::printf("costs: each stage's measured F, B, I, W (seconds, above), transfer %g, gather %g, optim %g\n",
                  costs.transfer, costs.gather, costs.optim);
    std::printf("step time %g; bubble %.2f%% of %lld ranks x step time", sim.step_time, 100 * sim.bubble(),
                static_cast<long long>(s.pp));
    const double formula = formula_bubble(s);
    const bool unit = costs.stages.empty() && costs.f == 1 && costs.i == 1 && costs.w == 1 && costs.b == 2 && costs.transfer == 0 &&
                      (args->zero3 == "none" || costs.gather == 0);
    if (formula >= 0 && unit) std::printf(" (formula %.2f%%)", 100 * formula);
    if (args->measure_ms > 0)
      std::printf("\nmeasured on %lld processes (actions sleep cost x %g ms): step %.1f ms (simulated %.1f ms); bubble "
                  "%.2f%% (simulated %.2f%%)",
                  static_cast<long long>(s.pp), args->measure_ms, 1000 * measured.step_time,
                  sim.step_time * args->measure_ms, 100 * measured.bubble, 100 * sim.bubble());
    std::printf("\npeak activations held (micro-batches x one stage), per rank:");
    for (int64_t peak : sim.peak_held) std::printf(" %lld", static_cast<long long>(peak));
    std::printf("\n");
    if (args->zero3 != "none") {
      std::printf("peak stages gathered whole (ZeRO-3 per %s), per rank:", args->zero3.c_str());
      for (int64_t peak : sim.peak_gathered) std::printf(" %lld", static_cast<long long>(peak));
      std::printf("\n");
    }
    if (!args->csv.empty()) {
      write_file_durable(args->csv, to_csv(s));
      std::printf("table: %s\n", args->csv.c_str());
    }
    if (!args->svg.empty()) {
      char title[160];
      std::snprintf(title, sizeof title, "%s, pp %lld, %lld micro-batches: step %g, bubble %.1f%%", s.name.c_str(),
                    static_cast<long long>(s.pp), static_cast<long long>(s.micro_batches), sim.step_time,
                    100 * sim.bubble());
      write_file_durable(args->svg, timeline_svg(s, sim, title));
      std::printf("timeline: %s\n", args->svg.c_str());
      if (args->measure_ms > 0) {
        Simulation seen;
        seen.timeline = measured.timeline;
        seen.step_time = measured.step_time;
        std::snprintf(title, sizeof title, "%s, pp %lld, %lld micro-batches, measured (sleeps of %g ms per unit): bubble %.1f%%",
                      s.name.c_str(), static_cast<long long>(s.pp), static_cast<long long>(s.micro_batches),
                      args->measure_ms, 100 * measured.bubble);
        const std::string path = std::filesystem::path(args->svg).replace_extension(".measured.svg").string();
        write_file_durable(path, timeline_svg(s, seen, title));
        std::printf("measured timeline: %s\n", path.c_str());
      }
    }
    return 0;
  };
}

}  // namespace tessera::cli
