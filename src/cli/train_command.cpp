// `tessera train`: trains from a config (file or preset) with --set overrides, or resumes from a
// checkpoint (whose own config is used when --config is not given), or starts from a checkpoint's
// weights alone (--init-from: an imported Hugging Face model, or another run's; its [model] is
// adopted, Config::adopt_model). With --nproc it launches
// that many workers (cli/launcher.h); a worker, or a process started by torchrun, mpirun or srun,
// joins the mesh its environment describes (comm/rendezvous.h) before training. The run directory
// is claimed and locked first (train/run_dir.h): by the launcher of node 0, or without a tessera
// launcher by global rank 0 before it joins the mesh; that process also prints the resolved config
// (every key and where its value came from). `--dry-run` stops after the checks and prints what
// the run would be.
#include <filesystem>
#include <iostream>

#include "checkpoint/checkpoint.h"
#include "cli/commands.h"
#include "cli/launcher.h"
#include "core/fault_injection.h"
#include "comm/device.h"
#include "comm/flight_recorder.h"
#include "comm/mesh.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/json_file.h"
#include "data/training_data.h"
#include "parallel/layout_check.h"
#include "plan/activation_policy.h"
#include "plan/memory_estimate.h"
#include "config/config.h"
#include "train/run_dir.h"
#include "train/stop_request.h"
#include "train/train_step.h"
#include "train/trainer.h"

namespace tessera::cli {
namespace {

// Every rank must train the same config (a node started with another file or --set would train
// another model or data order, or hang in a collective the others never issue). Compared after
// the mesh is up, data.path excepted (each host may mount the data elsewhere; the checkpoint's
// data manifest checks the contents). Collective.
void check_same_config(const Config& config, comm::Group& world) {
  if (world.size() == 1) return;
  Config compared = config;
  compared.data.path = "";
  const int64_t mine = static_cast<int64_t>(std::stoull(checksum(compared.to_toml_string()), nullptr, 16) >> 1);
  at::Tensor all = at::empty({world.size()}, at::kLong);
  world.all_gather(all, at::full({1}, mine, at::kLong));
  std::string differ;
  for (int64_t r = 1; r < world.size(); ++r)
    if (all[r].item<int64_t>() != all[0].item<int64_t>()) differ += (differ.empty() ? "" : ", ") + std::to_string(r);
  require(differ.empty(), "rank(s) ", differ, " resolved another config than rank 0 (a different --config file, --set or "
          "checkpoint on that node); every node must give the same. The resolved config is printed at the start and saved "
          "as RUN_DIR/config.toml on rank 0");
}

}  // namespace

Command add_train_command(CLI::App& app) {
  struct Args {
    std::string config, out, resume, init_from;
    std::vector<std::string> sets;
    bool overwrite = false, dry_run = false;
    LaunchOptions launch;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("train", "train a model (one process, or --nproc N workers per node)");
  cmd->add_option("--config", args->config, "config file, or a preset name from configs/ (e.g. tiny_gpt)");
  cmd->add_option("--set", args->sets, "override a config key: section.key=value (repeatable)")->take_all();
  cmd->add_option("--out", args->out,
                  "run directory (default: runs/<config name>; with --resume, the checkpoint's own run, continued in "
                  "place); a directory that holds another run is refused");
  CLI::Option* resume =
      cmd->add_option("--resume", args->resume, "continue from a checkpoint (a step_N, checkpoints or run directory)");
  cmd->add_option("--init-from", args->init_from,
                  "start from a checkpoint's model weights (e.g. one made by `tessera import`): step 0, a fresh "
                  "optimizer, the model keys taken from the checkpoint")
      ->excludes(resume);
  cmd->add_flag("--overwrite", args->overwrite, "train into --out even if it holds a run: its run files are deleted first");
  cmd->add_flag("--dry-run", args->dry_run,
                "resolve and check the config, layout, data and run directory, print them with the predicted memory "
                "per rank, and start nothing");
  cmd->add_option("--nproc", args->launch.nproc, "start this many worker processes on this node (like torchrun)");
  cmd->add_option("--nnodes", args->launch.nnodes, "number of nodes (hosts), each running its own `--nproc` launcher");
  cmd->add_option("--node-rank", args->launch.node_rank, "this node's index, 0 .. nnodes-1");
  cmd->add_option("--master", args->launch.master,
                  "HOST:PORT of the rendezvous store: one node's, served by rank 0 (default 127.0.0.1 and a free "
                  "port), or with --nnodes > 1 (required) the launchers' store, served by node 0's launcher");
  cmd->footer("Config keys (section.key, default, meaning):\n" + config_reference());
  return [args]() {
    require(args->init_from.empty() || !args->config.empty(),
            "train --init-from: give --config FILE|PRESET, the training config (its [model] comes from the checkpoint)");
    if (args->config.empty() && args->resume.empty()) fail("train: give --config FILE|PRESET (or --resume CHECKPOINT)");
    RunClaim claim;
    claim.overwrite = args->overwrite;
    // A node of a checkpoint.gather run that does not hold the run's checkpoints joins a resume
    // with the run's config and a local --out; rank 0 sends it the checkpoint.
    const bool resume_elsewhere = !args->resume.empty() && !std::filesystem::exists(args->resume);
    require(!resume_elsewhere || (!args->config.empty() && !args->out.empty()), "train --resume ", args->resume,
            ": does not exist on this node. A node without the run's checkpoints (checkpoint.gather = true) joins the "
            "resumed run with --config (the run's config) and --out (its local run directory); rank 0 sends it the "
            "checkpoint");
    if (!args->resume.empty() && !resume_elsewhere) {
      claim.resume_from = resolve_checkpoint_dir(args->resume);
      require(!read_json_file(claim.resume_from + "/meta.json").contains("imported_from"), "train --resume ",
              args->resume, ": ", claim.resume_from, " is an imported model without training state; start from it with "
              "--init-from ", args->resume, " --config FILE");
    }
    Config config = args->config.empty() ? Config::from_checkpoint_meta(claim.resume_from + "/meta.json", args->sets)
                                         : Config::load(args->config, args->sets);
    require(!resume_elsewhere || config.checkpoint.gather, "train --resume ", args->resume,
            ": does not exist on this node, and checkpoint.gather is false: give every node the checkpoint at this path "
            "(a shared directory or a copy), or run with checkpoint.gather = true");
    std::string init_from;
    if (!args->init_from.empty()) {
      init_from = resolve_checkpoint_dir(args->init_from);
      config.adopt_model(Config::from_checkpoint_meta(init_from + "/meta.json", {}), init_from);
    }
    std::string out = args->out;
    if (out.empty() && !claim.resume_from.empty()) {
      out = run_dir_of_checkpoint(claim.resume_from);
      require(!out.empty(), "train --resume ", args->resume, ": ", claim.resume_from,
              " is not inside a run directory (DIR/checkpoints/step_N), so there is no run to continue in place; "
              "give --out");
    }
    if (out.empty()) out = "runs/" + std::filesystem::path(args->config).stem().string();
    const std::string source = args->config.empty() ? args->resume : config_source(args->config);

    // Everything that can be refused is refused here, before any worker starts or the run
    // directory is touched: the layout, and memory the host cannot hold.
    const bool launching = args->launch.nproc > 0;
    require(launching || (args->launch.nnodes == 1 && args->launch.master.empty()),
            "train: --nnodes and --master need --nproc (the workers per node)");
    const comm::LaunchInfo launch = launching ? comm::LaunchInfo() : comm::launch_info_from_environment();
    const ParallelDims dims(config.parallel, launching ? int64_t{args->launch.nproc} * args->launch.nnodes : launch.world_size,
                            source);
    check_parallel_layout(config, dims);
    const int64_t accumulation = config.train.accumulation(dims.dp());
    const MemoryEstimate memory = estimate_memory(config, make_layout(config, dims));
    // A swapped run is held to its own prediction (plan/swap_cut.h) once its blocks are measured.
    const bool auto_activations = config.memory.activation_policy == "auto";
    if (auto_activations) check_activation_budget(config, dims);
    if (!config.memory.swap && !auto_activations)
      check_memory_fits(config, memory, launching ? args->launch.nproc : launch.local_world_size, host_memory_available());
    // The process that speaks for the run: the launcher of node 0, or global rank 0 when no
    // tessera launcher started this process (one process, torchrun, mpirun, srun).
    const bool lead = launching ? args->launch.node_rank == 0 : launch.launcher != "tessera" && launch.rank == 0;
    if (args->dry_run) {
      std::printf("config (after each key: where its value came from)\n%s\n%s", config.to_annotated_toml().c_str(),
                  describe_memory_estimate(config, dims, memory).c_str());
      std::printf("global batch: %lld sequences = train.batch_size %lld x %lld data-parallel ranks x %lld micro-batches\n",
                  static_cast<long long>(config.train.batch_size * dims.dp() * accumulation),
                  static_cast<long long>(config.train.batch_size), static_cast<long long>(dims.dp()),
                  static_cast<long long>(accumulation));
      std::printf("data: %s\nrun directory: %s\ndry run: the config, layout, data and run directory are valid; nothing "
                  "was started\n",
                  open_training_data(config.data, config.model.vocab_size).describe().c_str(),
                  describe_claim(out, claim).c_str());
      return 0;
    }
    if (lead) std::printf("config (after each key: where its value came from)\n%s\n", config.to_annotated_toml().c_str());
    require(!lead || !resume_elsewhere, "train --resume ", args->resume,
            ": does not exist here, on the node of rank 0, which holds the run's checkpoints");
    const std::unique_ptr<RunLock> lock = lead ? claim_run_dir(out, claim) : nullptr;
    require(config.parallel.max_restarts == 0 || args->launch.nnodes == 1 || !config.checkpoint.gather,
            "parallel.max_restarts = ", config.parallel.max_restarts, " with --nnodes ", args->launch.nnodes,
            " restarts every node's workers from the run directory's latest checkpoint, so every node must see it: "
            "checkpoint.gather = true (nodes without a shared run directory) cannot restart; set one of them to 0/false");
    if (launching)
      return launch_workers(args->launch, out, config.parallel.timeout_s,
                            Restarts{config.parallel.max_restarts, dims.world_size() / dims.dp()});

    const c10::Device device = comm::select_device(config.train.device, launch);  // one GPU per local rank
    if (device.is_cuda() && auto_activations)
      check_activation_budget(config, dims, static_cast<double>(comm::device_memory_bytes(device)));
    if (device.is_cuda() && !config.memory.swap && !auto_activations)
      check_memory_fits(config, memory, launch.local_world_size, host_memory_available(), comm::device_memory_bytes(device));
    if (device.is_cuda() && config.memory.swap) {
      const double capacity = static_cast<double>(comm::device_memory_bytes(device));
      require(capacity <= 0 || config.memory.device_budget_gb * 1024 * 1024 * 1024 <= capacity,
              "memory.device_budget_gb = ", config.memory.device_budget_gb, " exceeds ", device.str(), "'s ",
              capacity / (1024.0 * 1024 * 1024), " GiB");
    }
    fault::arm(launch.rank);
    std::unique_ptr<comm::Mesh> mesh = comm::Mesh::connect(launch, dims, config.parallel, device);
    check_same_config(config, mesh->world());
    check_shared_run_dir(out, mesh->world(), config.checkpoint.gather);
    stop_request::install();
    TrainSummary summary;
    try {
      Trainer trainer(config, out, TrainStart{args->resume, init_from}, mesh.get());
      summary = trainer.run();
    } catch (const std::exception& e) {  // what every group was doing, for `tessera doctor`
      if (mesh->world_size() > 1) comm::write_flight_record(out, launch.rank, e.what());
      throw;
    }
    if (!summary.stopped.empty()) {
      if (launch.rank == 0)
        std::printf("stopped: %lld of %lld steps (%s), checkpoint %s\n", static_cast<long long>(summary.steps),
                    static_cast<long long>(config.train.steps), summary.stopped.c_str(), summary.checkpoint.c_str());
      return kStoppedExitCode;
    }
    if (launch.rank != 0) return 0;
    std::printf("done: %lld steps, train loss %.4f, val loss %.4f (unigram baseline %.4f), checkpoint %s\n",
                static_cast<long long>(summary.steps), summary.last_loss, summary.last_val_loss,
                summary.unigram_baseline, summary.checkpoint.c_str());
    return 0;
  };
}

}  // namespace tessera::cli
