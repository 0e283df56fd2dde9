// `tessera plan calibrate --out F.toml [--device cuda]` measures this machine (or its first GPU) as a
// cluster file (plan/calibrate.h).
// `tessera plan --config C --cluster F [--world N] [--set k=v ...] [--top K] [--json]`: the layouts
// of a config on a cluster, predicted without running (plan/search.h, plan/cost_model.h;
// docs/plan.md). Keys given with --set are held, the other layout keys searched; with all of them
// held it predicts the one layout. Prints the best K as a table (or one JSON object) and the best
// layout's breakdown with a ready --set line.
#include <cstdio>
#include <filesystem>
#include <set>

#include <nlohmann/json.hpp>
#include <torch/cuda.h>

#include "cli/commands.h"
#include "core/error.h"
#include "parallel/layout_check.h"
#include "core/fs.h"
#include "plan/calibrate.h"
#include "plan/cluster.h"
#include "plan/activation_policy.h"
#include "plan/cost_model.h"
#include "plan/search.h"
#include "train/device_peak.h"
#include "config/config.h"
#if TESSERA_ATOM
#include "atom/round_cpu.h"
#endif

namespace tessera::cli {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::string set_line(const plan::Candidate& c) {
  std::string out;
  for (const auto& [key, value] : c.set) out += " --set " + key + "=" + value;
  return out;
}

nlohmann::json to_json(const plan::Candidate& c) {
  nlohmann::json set = nlohmann::json::object(), breakdown = nlohmann::json::object();
  for (const auto& [key, value] : c.set) set[key] = value;
  for (const auto& [name, seconds] : c.prediction.breakdown) breakdown[name] = seconds;
  // memory.activation_policy = auto: each rank's choice (by pipeline rank); empty otherwise.
  nlohmann::json policies = nlohmann::json::array();
  for (const ActivationPolicy& policy : c.prediction.activation_policies)
    policies.push_back(activation_policy_json(policy, c.prediction.micro_batches));
  return {{"set", set},
          {"runner", c.peers > 0 ? "tessera peer" : "tessera train"},
          {"peers", c.peers},
          {"dp", c.dims.dp()},
          {"micro_batches", c.prediction.micro_batches},
          {"step_s", c.prediction.step_s},
          {"tokens_per_s", c.prediction.tokens_per_s},
          {"model_flops_per_step", c.prediction.model_flops_per_step},
          {"mfu", c.prediction.mfu},
          {"peak_memory_gib", c.prediction.peak_memory_bytes / kGiB},
          {"fits", c.prediction.fits},
          {"breakdown", breakdown},
          {"activation_policy", policies}};
}

// The largest term of the step after compute: what binds the layout (or the memory it lacks).
std::string binding(const plan::Candidate& c, double device_gib) {
  if (!c.prediction.fits) {
    char text[96];
    std::snprintf(text, sizeof text, "memory %.0f > %.0f GiB", c.prediction.peak_memory_bytes / kGiB, device_gib);
    return text;
  }
  std::string name;
  double largest = 0;
  for (const auto& [term, seconds] : c.prediction.breakdown) {
    const bool compute = term == "products" || term == "attention" || term == "memory_bound";
    if (!compute && seconds > largest) largest = seconds, name = term;
  }
  if (name.empty()) return "compute";
  char text[96];
  std::snprintf(text, sizeof text, "%s %.0f%%", name.c_str(), 100 * largest / c.prediction.step_s);
  return text;
}

}  // namespace

Command add_plan_command(CLI::App& app) {
  struct Args {
    std::string config, cluster, attention = "flash", calibrate_out, calibrate_device = "cpu";
    std::vector<std::string> sets;
    int64_t world = 0, top = 5, calibrate_ranks = 0;
    double calibrate_seconds = 0.2, expert_load = 1;
    bool json = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("plan", "predict (and search) the parallel layout of a config on a cluster");
  cmd->add_option("--config", args->config, "config file, or a preset name from configs/ (e.g. gpt3_175b)");
  cmd->add_option("--cluster", args->cluster, "cluster file, or a preset name from clusters/ (e.g. dgx_a100_80g)");
  cmd->add_option("--set", args->sets, "hold a key: section.key=value (repeatable); layout keys not held are searched")
      ->take_all();
  cmd->add_option("--world", args->world, "ranks (default: the product of the config's parallel degrees)");
  cmd->add_option("--top", args->top, "layouts to print (default 5)");
  cmd->add_option("--attention", args->attention,
                  "how softmax attention runs: flash (tessera's) or unfused (scores materialized, as Megatron-LM "
                  "in 2021)")
      ->check(CLI::IsMember({"flash", "unfused"}));
  cmd->add_option("--expert-load", args->expert_load,
                  "dropless MoE under ep: the busiest ep rank's routed rows over an even share, as an earlier "
                  "run's moe.load shows (default 1: balanced)");
  cmd->add_flag("--json", args->json, "print {\"layouts\": [...]} best first");
  CLI::App* calibrate = cmd->add_subcommand("calibrate", "measure this machine and write it as a cluster file");
  calibrate->add_option("--out", args->calibrate_out, "the cluster file to write")->required();
  calibrate->add_option("--ranks", args->calibrate_ranks, "ranks a node runs at once (default: the cores)");
  calibrate->add_option("--seconds", args->calibrate_seconds, "seconds per measured point (default 0.2)");
  calibrate->add_option("--device", args->calibrate_device,
                        "cpu (this machine's cores as ranks) or cuda (the first GPU as a one-device node)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  return [args, calibrate]() {
    if (calibrate->parsed()) {
      plan::CalibrateOptions options;
      options.ranks = args->calibrate_ranks;
      options.seconds_per_point = args->calibrate_seconds;
#if TESSERA_ATOM
      options.round_cpu_ns_per_byte = atom::round_cpu_ns_per_byte;
#endif
      const auto progress = [](const std::string& what) { std::fprintf(stderr, "calibrate: %s\n", what.c_str()); };
      std::string text;
      if (args->calibrate_device == "cuda") {
        require(torch::cuda::is_available(), "tessera plan calibrate --device cuda: no CUDA device is usable here");
        const c10::Device card(c10::DeviceType::CUDA, 0);
        const DevicePeak bf16 = device_peak(card, at::kBFloat16, 0), fp32 = device_peak(card, at::kFloat, 0);
        const std::filesystem::path out(args->calibrate_out);
        const std::string table = out.stem().string() + ".matmul_bf16.csv";
        text = plan::calibrate_this_card(options, {bf16.flops / 1e12, fp32.flops / 1e12, bf16.basis, fp32.basis},
                                         (out.parent_path() / table).string(), table, progress);
      } else {
        text = plan::calibrate_this_machine(options, progress);
      }
      write_file_atomic(args->calibrate_out, text);
      plan::load_cluster(args->calibrate_out);  // what was written reads back as a cluster file
      std::printf("%s\nwritten to %s\n", text.c_str(), args->calibrate_out.c_str());
      return 0;
    }
    require(!args->config.empty() && !args->cluster.empty(), "tessera plan: --config and --cluster are required "
            "(or `tessera plan calibrate --out F.toml`)");
    const plan::Cluster cluster = plan::load_cluster(args->cluster);
    // The layout runs on the cluster's devices, whatever train.device the config names: the memory
    // estimate's device-dependent terms (the fused loss, the float32 residual on a CPU) follow it.
    std::vector<std::string> sets = args->sets;
    sets.push_back(std::string("train.device=") + (cluster.device.kind == "cpu" ? "cpu" : "cuda"));
    const Config config = Config::load(args->config, sets);
    const ParallelOptions& p = config.parallel;
    const int64_t world = args->world > 0 ? args->world : std::max<int64_t>(p.dp, 1) * p.tp * p.pp * p.sp;
    std::set<std::string> held;
    for (const std::string& assignment : args->sets) held.insert(assignment.substr(0, assignment.find('=')));
    plan::CostOptions options;
    options.attention = args->attention;
    options.expert_load = args->expert_load;
    plan::check_modelled(config);
    const int64_t top = std::max<int64_t>(args->top, 1);
    const plan::SearchResult result =
        plan::search_layouts(config, world, held, cluster, check_layout_options, top, options);
    require(!result.layouts.empty(), "tessera plan: none of the ", result.considered, " layouts could be built",
            result.first_refusal.empty() ? std::string() : "; the first refusal: " + result.first_refusal);
    const size_t shown = std::min<size_t>(result.layouts.size(), static_cast<size_t>(top));
    if (args->json) {
      nlohmann::json layouts = nlohmann::json::array();
      for (size_t i = 0; i < shown; ++i) layouts.push_back(to_json(result.layouts[i]));
      std::printf("%s\n", nlohmann::json{{"layouts", layouts}, {"considered", result.considered},
                                         {"refused", result.refused}, {"predicted", result.predicted}}.dump(1).c_str());
      return 0;
    }
    std::printf("%s on %s (%s), %lld ranks: %lld layouts considered, %lld of those examined refused by the layout checks, "
                "%lld predicted whole (the others bounded out)\n",
                args->config.c_str(), cluster.source.c_str(), cluster.device.name.c_str(),
                static_cast<long long>(world), static_cast<long long>(result.considered),
                static_cast<long long>(result.refused), static_cast<long long>(result.predicted));
    std::printf("%4s %4s %4s %5s %-13s %4s %-7s %3s %-9s %4s %6s %10s %12s %6s %8s  %s\n", "#", "tp", "pp", "dp",
                "schedule", "zero", "host", "msp", "ckpt", "mb", "m", "step s", "tokens/s", "MFU", "mem GiB", "binds");
    for (size_t i = 0; i < shown; ++i) {
      const plan::Candidate& c = result.layouts[i];
      std::string schedule = c.peers > 0 ? "peers " + c.config.swarm.sync : c.dims.pp() > 1 ? c.config.parallel.pp_schedule : "-";
      if (c.dims.pp() > 1 && c.config.parallel.pp_virtual > 0)
        schedule += " v" + std::to_string(c.config.parallel.pp_virtual);
      const char* host = c.config.memory.swap ? "swap" : c.config.parallel.offload ? "offload" : "-";
      std::printf("%4zu %4lld %4lld %5lld %-13s %4lld %-7s %3s %-9s %4lld %6lld %10.3f %12.0f %5.1f%% %8.1f  %s\n", i + 1,
                  static_cast<long long>(c.dims.tp()), static_cast<long long>(c.dims.pp()),
                  static_cast<long long>(c.dims.dp()), schedule.c_str(),
                  static_cast<long long>(c.config.parallel.zero_stage), host, c.config.parallel.megatron_sp ? "yes" : "no",
                  c.config.memory.activation_checkpointing.c_str(), static_cast<long long>(c.config.train.batch_size),
                  static_cast<long long>(c.prediction.micro_batches), c.prediction.step_s, c.prediction.tokens_per_s,
                  100 * c.prediction.mfu, c.prediction.peak_memory_bytes / kGiB,
                  binding(c, cluster.device.memory_gib).c_str());
    }
    const plan::Candidate& best = result.layouts.front();
    std::printf("\nbest layout's step (%.3f s), by part:\n", best.prediction.step_s);
    for (const auto& [name, seconds] : best.prediction.breakdown)
      if (seconds > 0)
        std::printf("  %-32s %10.4f s  %5.1f%%\n", name.c_str(), seconds, 100 * seconds / best.prediction.step_s);
    if (best.config.model.ffn == "moe" && best.config.model.moe_capacity_factor <= 0 && best.dims.ep() > 1)
      std::printf("dropless routing over ep = %lld: the busiest rank's experts priced at %.3g x an even share of the "
                  "rows (--expert-load; an earlier run's moe.load shows it)\n",
                  static_cast<long long>(best.dims.ep()), args->expert_load);
    if (!best.prediction.activation_policies.empty()) {
      std::printf("the best layout's activation policy, as its run would choose from these predicted costs:\n");
      for (const ActivationPolicy& policy : best.prediction.activation_policies)
        std::printf("%s", describe_activation_policy(policy).c_str());
    }
    if (best.peers > 0)
      std::printf("run each of the %lld peers with: tessera peer --config %s%s\n", static_cast<long long>(best.peers),
                  args->config.c_str(), set_line(best).c_str());
    else
      std::printf("run it with:%s\n", set_line(best).c_str());
    if (!best.prediction.fits) std::printf("no layout fits the device's %.0f GiB\n", cluster.device.memory_gib);
    return 0;
  };
}

}  // namespace tessera::cli
