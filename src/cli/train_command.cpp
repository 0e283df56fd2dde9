// `tessera train`: trains from a config (file or preset) with --set overrides, or resumes from a
// checkpoint (whose own config is used when --config is not given). With --nproc it launches
// that many workers (cli/launcher.h); a worker, or a process started by torchrun, mpirun or srun,
// joins the mesh its environment describes (comm/rendezvous.h) before training. The run directory
// is claimed and locked first (train/run_dir.h): by the launcher of node 0, or without a tessera
// launcher by global rank 0 before it joins the mesh.
#include <filesystem>
#include <iostream>

#include "checkpoint/checkpoint.h"
#include "cli/commands.h"
#include "cli/launcher.h"
#include "comm/device.h"
#include "comm/mesh.h"
#include "core/error.h"
#include "train/config.h"
#include "train/run_dir.h"
#include "train/train_step.h"
#include "train/trainer.h"

namespace tessera::cli {

Command add_train_command(CLI::App& app) {
  struct Args {
    std::string config, out, resume;
    std::vector<std::string> sets;
    bool overwrite = false;
    LaunchOptions launch;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("train", "train a model (one process, or --nproc N workers per node)");
  cmd->add_option("--config", args->config, "config file, or a preset name from configs/ (e.g. tiny_gpt)");
  cmd->add_option("--set", args->sets, "override a config key: section.key=value (repeatable)")->take_all();
  cmd->add_option("--out", args->out,
                  "run directory (default: runs/<config name>; with --resume, the checkpoint's own run, continued in "
                  "place); a directory that holds another run is refused");
  cmd->add_option("--resume", args->resume, "continue from a checkpoint (a step_N, checkpoints or run directory)");
  cmd->add_flag("--overwrite", args->overwrite, "train into --out even if it holds a run: its run files are deleted first");
  cmd->add_option("--nproc", args->launch.nproc, "start this many worker processes on this node (like torchrun)");
  cmd->add_option("--nnodes", args->launch.nnodes, "number of nodes (hosts), each running its own `--nproc` launcher");
  cmd->add_option("--node-rank", args->launch.node_rank, "this node's index, 0 .. nnodes-1");
  cmd->add_option("--master", args->launch.master,
                  "HOST:PORT where rank 0 serves the rendezvous store (required with --nnodes > 1; "
                  "default 127.0.0.1 and a free port)");
  cmd->footer("Config keys (section.key, default, meaning):\n" + config_reference());
  return [args]() {
    if (args->config.empty() && args->resume.empty()) fail("train: give --config FILE|PRESET (or --resume CHECKPOINT)");
    RunClaim claim;
    claim.overwrite = args->overwrite;
    if (!args->resume.empty()) claim.resume_from = resolve_checkpoint_dir(args->resume);
    Config config = args->config.empty() ? Config::from_checkpoint_meta(claim.resume_from + "/meta.json", args->sets)
                                         : Config::load(args->config, args->sets);
    std::string out = args->out;
    if (out.empty() && !claim.resume_from.empty()) {
      out = run_dir_of_checkpoint(claim.resume_from);
      require(!out.empty(), "train --resume ", args->resume, ": ", claim.resume_from,
              " is not inside a run directory (DIR/checkpoints/step_N), so there is no run to continue in place; "
              "give --out");
    }
    if (out.empty()) out = "runs/" + std::filesystem::path(args->config).stem().string();
    const std::string source = args->config.empty() ? args->resume : resolve_config_path(args->config);
    if (args->launch.nproc > 0) {
      // Refused here, before any worker starts.
      check_parallel_layout(config, ParallelDims(config.parallel, int64_t{args->launch.nproc} * args->launch.nnodes, source));
      const std::unique_ptr<RunLock> lock = args->launch.node_rank == 0 ? claim_run_dir(out, claim) : nullptr;
      return launch_workers(args->launch, out);
    }
    require(args->launch.nnodes == 1 && args->launch.master.empty(),
            "train: --nnodes and --master need --nproc (the workers per node)");

    const comm::LaunchInfo launch = comm::launch_info_from_environment();
    const ParallelDims dims(config.parallel, launch.world_size, source);
    check_parallel_layout(config, dims);  // a layout error is reported before the run directory is touched
    const std::unique_ptr<RunLock> lock =
        launch.launcher != "tessera" && launch.rank == 0 ? claim_run_dir(out, claim) : nullptr;
    const c10::Device device = comm::select_device(config.train.device, launch);  // one GPU per local rank
    std::unique_ptr<comm::Mesh> mesh = comm::Mesh::connect(launch, dims, config.parallel, device);
    Trainer trainer(config, out, args->resume, mesh.get());
    TrainSummary summary = trainer.run();
    if (launch.rank != 0) return 0;
    std::printf("done: %lld steps, train loss %.4f, val loss %.4f (unigram baseline %.4f), checkpoint %s\n",
                static_cast<long long>(summary.steps), summary.last_loss, summary.last_val_loss,
                summary.unigram_baseline, summary.checkpoint.c_str());
    return 0;
  };
}

}  // namespace tessera::cli
