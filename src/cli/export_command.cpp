// `tessera export`: one consolidated safetensors file from any checkpoint, including a multi-rank
// one whose optimizer state is spread over per-rank shards. The model file keeps its Hugging Face
// GPT-2 names (loadable by `transformers`) and the embedding loses its padded rows (model.vocab_size
// rows, not model.vocab_multiple's padding); --optimizer writes the whole optimizer state as
// trained (padded). --hf DIR writes a folder that transformers' from_pretrained loads (and
// `tessera import --hf` reads back): model.safetensors, config.json (model/hf_gpt2.h for GPT-2,
// model/hf_llama.h for the Llama family, with transformers' names), the tokenizer (GPT-2's BPE as
// vocab.json and merges.txt; Hugging Face's tokenizer.json and SentencePiece's tokenizer.model as
// the checkpoint holds them) and the files an import carried (generation_config.json,
// tokenizer_config.json, special_tokens_map.json: model/hf_config.h).
#include <filesystem>
#include <iostream>

#include "checkpoint/checkpoint.h"
#include "cli/commands.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/json_file.h"
#include "data/hf_tokenizer.h"
#include "model/hf_config.h"
#include "model/hf_gpt2.h"
#include "model/hf_llama.h"
#include "model/hf_names.h"
#include "config/config.h"

namespace tessera::cli {
namespace {

namespace fs = std::filesystem;

void copy_into(const std::string& from, const std::string& to) {
  write_file_durable(to, read_file(from));
}

// config.json, the tokenizer in the files transformers reads, and the carried files.
void write_hf_folder(const std::string& dir, const ModelOptions& model, const std::string& checkpoint_dir) {
  fs::create_directories(dir);
  const nlohmann::json config =
      uses_hf_gpt2_names(model) ? hf_config_from_model_options(model) : hf_llama_family_config(model);
  write_file_durable(dir + "/config.json", config.dump(2) + "\n");
  for (const char* name : kHfCarriedFiles)
    if (fs::is_regular_file(checkpoint_dir + "/" + name)) copy_into(checkpoint_dir + "/" + name, dir + "/" + name);
  if (fs::is_regular_file(checkpoint_dir + "/tokenizer.model"))
    copy_into(checkpoint_dir + "/tokenizer.model", dir + "/tokenizer.model");
  const std::string tokenizer = checkpoint_dir + "/tokenizer.json";
  if (!fs::exists(tokenizer)) return;
  const nlohmann::json description = read_json_file(tokenizer);
  if (is_hf_tokenizer_json(description)) {
    copy_into(tokenizer, dir + "/tokenizer.json");
  } else if (description.value("type", std::string()) == "gpt2") {
    copy_into(checkpoint_dir + "/" + description.value("encoder", std::string()), dir + "/vocab.json");
    copy_into(checkpoint_dir + "/" + description.value("merges", std::string()), dir + "/merges.txt");
  }
}

}  // namespace

Command add_export_command(CLI::App& app) {
  struct Args {
    std::string checkpoint, out, hf, optimizer_out;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("export", "write a checkpoint as one consolidated safetensors file");
  cmd->add_option("--checkpoint", args->checkpoint, "a step_N, checkpoints or run directory")->required();
  CLI::Option* out = cmd->add_option("--out", args->out, "the model file to write (e.g. model.safetensors)");
  cmd->add_option("--hf", args->hf, "write a Hugging Face folder (model, config.json, tokenizer) to this directory")
      ->excludes(out);
  cmd->add_option("--optimizer", args->optimizer_out,
                  "also write the whole optimizer state (reassembled from the shards) to this file");
  return [args]() {
    require(!args->out.empty() || !args->hf.empty(), "export: give --out FILE or --hf DIR");
    LoadedCheckpoint ckpt = load_checkpoint(args->checkpoint, !args->optimizer_out.empty());
    const ModelOptions model = Config::from_checkpoint_meta(ckpt.dir + "/meta.json", {}).model;
    for (const char* param : {"wte.weight", "lm_head.weight"})  // the padded rows stay in tessera's checkpoints
      if (auto it = ckpt.model.find(export_name(model, param)); it != ckpt.model.end() && it->second.size(0) > model.vocab_size)
        it->second = it->second.narrow(0, 0, model.vocab_size).contiguous();
    auto sorted = [](const std::map<std::string, at::Tensor>& tensors) {
      return NamedTensors(tensors.begin(), tensors.end());
    };
    if (!args->hf.empty()) {
      const std::string refusal = uses_hf_gpt2_names(model) ? "" : hf_llama_family_refusal(model);
      require(refusal.empty(), "export --hf: ", ckpt.dir, " holds a model that is neither GPT-2 nor of the Llama "
              "family (", refusal, "); use --out for a safetensors file of its own names");
      write_hf_folder(args->hf, model, ckpt.dir);
      if (!uses_hf_gpt2_names(model)) ckpt.model = hf_llama_family_weights(model, ckpt.model);
      args->out = args->hf + "/model.safetensors";
    }
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
