// `tessera import --hf DIR --out CHECKPOINTS_DIR`: a local Hugging Face GPT-2 folder
// (model/hf_gpt2.h) or Llama-family folder (model/hf_llama.h) becomes a tessera checkpoint, CHECKPOINTS_DIR/step_0 with `latest` naming it,
// that `tessera generate --checkpoint` reads and `tessera train --init-from` starts from. The model
// is built from config.json, the weights go through import_state (every tensor checked by name and
// shape; the embedding gains model.vocab_multiple's zero rows) and are written by the checkpoint
// writer, so the result passes load_checkpoint's integrity checks like any checkpoint. The folder's
// tokenizer comes along: GPT-2's BPE from vocab.json and merges.txt, or else Hugging Face's
// tokenizer.json and SentencePiece's tokenizer.model as they are (data/tokenizer.h reads both),
// loaded once to check them; so do generation_config.json, tokenizer_config.json and
// special_tokens_map.json (model/hf_config.h), which `tessera export --hf` writes back. The
// checkpoint holds no optimizer state or data position: meta.json's "imported_from" marks it, and
// `train --resume` refuses it in favour of --init-from.
#include <unistd.h>

#include <filesystem>
#include <iostream>

#include "checkpoint/checkpoint.h"
#include "cli/commands.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/json_file.h"
#include "data/tokenizer.h"
#include "model/hf_config.h"
#include "model/hf_gpt2.h"
#include "model/hf_llama.h"
#include "model/hf_names.h"
#include "model/transformer.h"
#include "config/config.h"
#include "model/model_size.h"

namespace tessera::cli {
namespace {

namespace fs = std::filesystem;

// The folder's tokenizer as the checkpoint must copy it, and what it is, or no files when the
// folder has none. GPT-2's BPE files get a tokenizer.json of tessera's, written into `staging` (a
// scratch directory); Hugging Face's tokenizer.json and tokenizer.model are copied as they are.
// Either is checked by loading it, and its ids must fit the model's vocabulary.
struct StagedTokenizer {
  std::vector<std::string> files;
  std::string what;
};

StagedTokenizer stage_tokenizer(const fs::path& dir, const fs::path& staging, int64_t model_vocab) {
  StagedTokenizer staged;
  fs::path loaded_from = dir;
  if (fs::exists(dir / "vocab.json") && fs::exists(dir / "merges.txt")) {
    const int64_t vocab = static_cast<int64_t>(read_json_file((dir / "vocab.json").string()).size());
    fs::create_directories(staging);
    for (const char* name : {"vocab.json", "merges.txt"}) fs::copy_file(dir / name, staging / name);
    const nlohmann::json description = {
        {"type", "gpt2"}, {"vocab_size", vocab}, {"encoder", "vocab.json"}, {"merges", "merges.txt"}};
    write_file_durable((staging / "tokenizer.json").string(), description.dump(2) + "\n");
    staged = {{(staging / "tokenizer.json").string(), (staging / "vocab.json").string(),
               (staging / "merges.txt").string()},
              "GPT-2 BPE from vocab.json and merges.txt"};
    loaded_from = staging;
  } else {
    for (const char* name : {"tokenizer.json", "tokenizer.model"})
      if (fs::is_regular_file(dir / name)) staged.files.push_back((dir / name).string());
    if (staged.files.empty()) return staged;
  }
  const auto tokenizer = load_tokenizer(loaded_from.string());
  if (staged.what.empty())
    staged.what = tokenizer->type() == "sentencepiece" ? "SentencePiece BPE from tokenizer.model"
                                                       : "Hugging Face's byte-level BPE from tokenizer.json";
  require(tokenizer->vocab_size() <= model_vocab, dir.string(), ": the tokenizer's ", tokenizer->vocab_size(),
          " tokens do not fit the model's vocab_size ", model_vocab);
  return staged;
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
    const StagedTokenizer tokenizer = stage_tokenizer(dir, staging, config.model.vocab_size);
    contents.extra_files = tokenizer.files;
    contents.extra_texts = hf_carried_files(dir.string());
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
              << (tokenizer.files.empty()
                      ? "no tokenizer in the folder (tokenizer.json, tokenizer.model, or vocab.json and merges.txt): "
                        "give `tessera generate` a --tokenizer DIR\n"
                      : "tokenizer: " + tokenizer.what + "\n")
              << "use it with: tessera generate --checkpoint " << args->out << "   or   tessera train --init-from "
              << args->out << " ...\n";
    return 0;
  };
}

}  // namespace tessera::cli
