// `tessera export`: one consolidated safetensors file from any checkpoint, including a multi-rank
// one whose optimizer state is spread over per-rank shards. The model file keeps its Hugging Face
// GPT-2 names (loadable by `transformers`) and the embedding loses its padded rows (model.vocab_size
// rows, not model.vocab_multiple's padding); --optimizer writes the whole optimizer state as
// trained (padded).
#include <iostream>

#include "checkpoint/checkpoint.h"
#include "cli/commands.h"
#include "core/error.h"
#include "model/hf_names.h"
#include "train/config.h"

namespace tessera::cli {

Command add_export_command(CLI::App& app) {
  struct Args {
    std::string checkpoint, out, optimizer_out;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("export", "write a checkpoint as one consolidated safetensors file");
  cmd->add_option("--checkpoint", args->checkpoint, "a step_N, checkpoints or run directory")->required();
  cmd->add_option("--out", args->out, "the model file to write (e.g. model.safetensors)")->required();
  cmd->add_option("--optimizer", args->optimizer_out,
                  "also write the whole optimizer state (reassembled from the shards) to this file");
  return [args]() {
    LoadedCheckpoint ckpt = load_checkpoint(args->checkpoint, !args->optimizer_out.empty());
    const ModelOptions model = Config::from_checkpoint_meta(ckpt.dir + "/meta.json", {}).model;
    const std::string embedding = export_name(model, "wte.weight");
    if (auto it = ckpt.model.find(embedding); it != ckpt.model.end() && it->second.size(0) > model.vocab_size)
      it->second = it->second.narrow(0, 0, model.vocab_size).contiguous();
    auto sorted = [](const std::map<std::string, at::Tensor>& tensors) {
      return NamedTensors(tensors.begin(), tensors.end());
    };
    write_safetensors(args->out, sorted(ckpt.model), {{"format", "pt"}});
    std::cout << "wrote " << args->out << ": " << ckpt.model.size() << " tensors from " << ckpt.dir << "\n";
    if (!args->optimizer_out.empty()) {
      write_safetensors(args->optimizer_out, sorted(ckpt.optimizer));
      std::cout << "wrote " << args->optimizer_out << ": " << ckpt.optimizer.size() << " tensors ("
                << ckpt.meta.value("optimizer_shards", int64_t{1}) << " shards)\n";
    }
    return 0;
  };
}

}  // namespace tessera::cli
