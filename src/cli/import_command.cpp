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
#include <map>
#include <set>

#include <torch/version.h>

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

// A Llama-family folder written part by part (model/hf_llama.h's parts: the embedding and head,
// each block, the final norm), each part one shard of a sharded checkpoint (model-<k>-of-<N>, as a
// multi-rank run writes them; checkpoint/checkpoint.h), so that the import holds one part and the
// folder's tensors it is made of, never the whole model: a 70B folder imports on a host that could
// not hold it. Each tensor is checked against the model's parameter of its name (a meta-device
// model: no memory) and stored as a run's checkpoint stores it (fp32, the embedding's padded rows);
// the names over all parts must be the model's. A failure removes the partial directory.
std::string import_in_parts(const std::string& dir, const ModelOptions& o, const std::string& out,
                            CheckpointContents& contents) {
  const TransformerLM meta(o, ModelStage{}, at::TensorOptions().device(at::kMeta));
  std::map<std::string, std::pair<std::string, std::vector<int64_t>>> parameter_of;  // export name -> name, shape
  std::vector<std::string> params;
  for (const auto& item : meta->named_parameters()) {
    parameter_of[export_name(o, item.key())] = {item.key(), item.value().sizes().vec()};
    params.push_back(item.key());
  }
  const int64_t parts = hf_llama_part_count(o);
  const std::string partial = prepare_checkpoint_dir(out, 0);
  try {
    std::set<std::string> written;
    int64_t part = 0;
    read_hf_llama_parts(dir, o, [&](std::map<std::string, at::Tensor> tensors) {
      std::vector<TensorSlice> slices;
      for (const auto& [name, stored] : tensors) {
        const auto it = parameter_of.find(name);
        require(it != parameter_of.end(), dir, ": the folder gives '", name, "', which the model has no parameter for");
        const auto& [param, shape] = it->second;
        auto [stored_name, value] = export_tensor(o, param, import_tensor(o, param, stored, shape, dir).to(at::kFloat));
        slices.push_back({stored_name, value, Region::whole(value.sizes().vec())});
        written.insert(stored_name);
      }
      require(part < parts, "internal: more parts than hf_llama_part_count");
      write_model_shard(partial, part++, parts, slices);
    });
    require(part == parts, "internal: ", part, " parts of ", parts);
    check_export_names(o, params, written, dir);
    contents.model_shards = parts;
    return commit_checkpoint(out, 0, contents, 0);
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(partial, ignored);
    throw;
  }
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
    const fs::path staging = fs::temp_directory_path() / ("tessera-import-" + std::to_string(::getpid()));
    fs::remove_all(staging);
    CheckpointContents contents;
    const StagedTokenizer tokenizer = stage_tokenizer(dir, staging, config.model.vocab_size);
    contents.extra_files = tokenizer.files;
    contents.extra_texts = hf_carried_files(dir.string());
    contents.meta = {{"config", config.to_toml_string()},
                     {"imported_from", fs::absolute(dir).lexically_normal().string()},
                     {"torch_version", TORCH_VERSION}};
    fs::create_directories(out);
    std::string written;
    if (llama_family) {
      written = import_in_parts(dir.string(), config.model, out.string(), contents);
    } else {
      TransformerLM model(config.model);
      import_state(*model, read_hf_gpt2_weights(dir.string()), args->hf);
      contents.model = export_state(*model);
      written = save_checkpoint(out.string(), 0, contents);
    }
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
