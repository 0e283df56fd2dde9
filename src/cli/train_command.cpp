// `tessera train`: trains from a config (file or preset) with --set overrides, or resumes from a
// checkpoint (whose own config is used when --config is not given).
#include <filesystem>
#include <iostream>

#include "checkpoint/checkpoint.h"
#include "cli/commands.h"
#include "core/error.h"
#include "train/config.h"
#include "train/trainer.h"

namespace tessera::cli {

Command add_train_command(CLI::App& app) {
  struct Args {
    std::string config, out, resume;
    std::vector<std::string> sets;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("train", "train a model (single process)");
  cmd->add_option("--config", args->config, "config file, or a preset name from configs/ (e.g. tiny_gpt)");
  cmd->add_option("--set", args->sets, "override a config key: section.key=value (repeatable)")->take_all();
  cmd->add_option("--out", args->out, "run directory (default: runs/<config name>)");
  cmd->add_option("--resume", args->resume, "continue from a checkpoint (a step_N, checkpoints or run directory)");
  cmd->footer("Config keys (section.key, default, meaning):\n" + config_reference());
  return [args]() {
    if (args->config.empty() && args->resume.empty()) fail("train: give --config FILE|PRESET (or --resume CHECKPOINT)");
    Config config = args->config.empty() ? Config::from_checkpoint_meta(resolve_checkpoint_dir(args->resume) + "/meta.json", args->sets)
                                         : Config::load(args->config, args->sets);
    std::string out = args->out;
    if (out.empty()) {
      std::string name = args->config.empty() ? "resumed" : std::filesystem::path(args->config).stem().string();
      out = "runs/" + name;
    }
    Trainer trainer(config, out, args->resume);
    TrainSummary summary = trainer.run();
    std::printf("done: %lld steps, train loss %.4f, val loss %.4f (unigram baseline %.4f), checkpoint %s\n",
                static_cast<long long>(summary.steps), summary.last_loss, summary.last_val_loss,
                summary.unigram_baseline, summary.checkpoint.c_str());
  };
}

}  // namespace tessera::cli
