// `tessera import --hf DIR --out CHECKPOINTS_DIR`: a local Hugging Face GPT-2 folder
// (model/hf_gpt2.h) or Llama-family folder (model/hf_llama.h) becomes a tessera checkpoint, CHECKPOINTS_DIR/step_0 with `latest` naming it,
// that `tessera generate --checkpoint` reads and `tessera train --init-from` starts from. The model
// is built from config.json, the weights go through import_state (every tensor checked by name and
// shape; the embedding gains model.vocab_multiple's zero rows) and are written by the checkpoint
// writer, so the result passes load_checkpoint's integrity checks like any checkpoint. A folder
// with vocab.json and merges.txt keeps its tokenizer (GPT-2's BPE). The checkpoint holds no
// optimizer state or data position: meta.json's "imported_from" marks it, and `train --resume`
// refuses it in favour of --init-from.
#include <unistd.h>

#include <filesystem>
#include <iostream>

#include "checkpoint/checkpoint.h"
#include "cli/commands.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/json_file.h"
#include "data/tokenizer.h"
#include "model/hf_gpt2.h"
#include "model/hf_llama.h"
#include "model/hf_names.h"
#include "model/transformer.h"
#include "config/config.h"
#include "model/model_size.h"

namespace tessera::cli {
namespace {

namespace fs = std::filesystem;

// tokenizer.json for the folder's GPT-2 BPE files, written into `staging` (a scratch directory)
// and checked by loading it; the files the checkpoint must copy, or none when `dir` has no BPE.
std::vector<std::string> stage_tokenizer(const fs::path& dir, const fs::path& staging, int64_t model_vocab) {
  if (!fs::exists(dir / "vocab.json") || !fs::exists(dir / "merges.txt")) return {};
  const int64_t vocab = static_cast<int64_t>(read_json_file((dir / "vocab.json").string()).size());
  fs::create_directories(staging);
  for (const char* name : {"vocab.json", "merges.txt"}) fs::copy_file(dir / name, staging / name);
  const nlohmann::json description = {
      {"type", "gpt2"}, {"vocab_size", vocab}, {"encoder", "vocab.json"}, {"merges", "merges.txt"}};
  write_file_durable((staging / "tokenizer.json").string(), description.dump(2) + "\n");
  const int64_t loaded = load_tokenizer(staging.string())->vocab_size();
  require(loaded <= model_vocab, (dir / "vocab.json").string(), ": ", loaded,
          " tokens do not fit the model's vocab_size ", model_vocab);
  return {(staging / "tokenizer.json").string(), (staging / "vocab.json").string(), (staging / "merges.txt").string()};
}

}  // namespace

Command add_import_command(CLI::App& app) {
  struct Args {
    std::string hf, out;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "import", "make a tessera checkpoint from a Hugging Face folder (GPT-2, Llama, Mistral, Qwen 2, Qwen 3)");
  cmd->add_option("--hf", args->hf, "folder with config.json and model.safetensors (transformers' save_pretrained)")
      ->required();
  cmd->add_option("--out", args->out, "checkpoints directory to create (step_0 and latest are written in it)")
      ->required();
  return [args]() {
    const fs::path dir(args->hf), out(args->out);
    require(fs::is_directory(dir), args->hf, ": not a directory");
    require(!fs::exists(out) || (fs::is_directory(out) && fs::is_empty(out)), args->out,
            ": exists and is not an empty directory; import into a new one");
    Config config;
    const std::string config_path = (dir / "config.json").string();
    const nlohmann::json hf_config = read_json_file(config_path);
    const bool llama_family = is_hf_llama_family(hf_config);
    config.model = llama_family ? llama_family_options_from_hf_config(hf_config, config.model, config_path)
                                : model_options_from_hf_config(hf_config, config.model, config_path);
    config.train.seq_len = std::min(config.train.seq_len, config.model.block_size);
    config.check(config_path);
    TransformerLM model(config.model);
    import_state(*model, llama_family ? read_hf_llama_weights(dir.string(), config.model) : read_hf_gpt2_weights(dir.string()),
                 args->hf);

    const fs::path staging = fs::temp_directory_path() / ("tessera-import-" + std::to_string(::getpid()));
    fs::remove_all(staging);
    CheckpointContents contents;
    contents.model = export_state(*model);
    contents.extra_files = stage_tokenizer(dir, staging, config.model.vocab_size);
    contents.meta = {{"config", config.to_toml_string()},
                     {"imported_from", fs::absolute(dir).lexically_normal().string()},
                     {"torch_version", TORCH_VERSION}};
    fs::create_directories(out);
    const std::string written = save_checkpoint(out.string(), 0, contents);
    fs::remove_all(staging);
    const ModelOptions& m = config.model;
    std::cout << "imported " << args->hf << " (" << hf_config.value("model_type", "gpt2") << ": n_layer " << m.n_layer << ", n_head " << m.n_head << ", n_embd "
              << m.n_embd << ", vocab_size " << m.vocab_size << ", block_size " << m.block_size << ", "
              << parameter_count(m) << " parameters) into " << written << "\n"
              << (contents.extra_files.empty()
                      ? "no vocab.json and merges.txt in the folder: give `tessera generate` a --tokenizer DIR\n"
                      : "tokenizer: GPT-2 BPE from vocab.json and merges.txt\n")
              << "use it with: tessera generate --checkpoint " << args->out << "   or   tessera train --init-from "
              << args->out << " ...\n";
    return 0;
  };
}

}  // namespace tessera::cli
