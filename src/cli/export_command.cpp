// `tessera export`: one consolidated safetensors file from any checkpoint, including a multi-rank
// one whose optimizer state is spread over per-rank shards. The model file keeps its Hugging Face
// GPT-2 names (loadable by `transformers`) and the embedding loses its padded rows (model.vocab_size
// rows, not model.vocab_multiple's padding); --optimizer writes the whole optimizer state as
// trained (padded). --hf DIR writes a folder that transformers' from_pretrained loads (and
// `tessera import --hf` reads back): model.safetensors (a Llama-family model written part by part,
// in transformers' sharded layout when it is larger than --max-shard-mb), config.json (model/hf_gpt2.h for GPT-2,
// model/hf_llama.h for the Llama family, with transformers' names), the tokenizer (GPT-2's BPE as
// vocab.json and merges.txt; Hugging Face's tokenizer.json and SentencePiece's tokenizer.model as
// the checkpoint holds them) and the files an import carried (generation_config.json,
// tokenizer_config.json, special_tokens_map.json: model/hf_config.h).
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <vector>

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

// The embedding or an untied head cut to model.vocab_size rows (the padded rows of
// model.vocab_multiple stay in tessera's checkpoints); any other tensor as it is.
at::Tensor without_padded_rows(const ModelOptions& model, const std::string& param, const at::Tensor& t) {
  const bool vocabulary = param == "wte.weight" || param == "lm_head.weight";
  return vocabulary && t.size(0) > model.vocab_size ? t.narrow(0, 0, model.vocab_size).contiguous() : t;
}

// A Llama-family model into `dir` under transformers' names, read from the checkpoint one part at a
// time (model/hf_llama.h: the embedding and head, each block, the final norm) and written in files
// of at least `shard_bytes` (the last smaller): one file is model.safetensors, several are
// model-<k>-of-<N>.safetensors with model.safetensors.index.json, transformers' sharded layout. At
// most one file's tensors and one part are held, never the whole model. Returns the tensor count.
size_t write_llama_family_model(const LoadedCheckpoint& ckpt, const ModelOptions& model, const std::string& dir,
                                double shard_bytes) {
  for (const auto& entry : fs::directory_iterator(dir)) {  // a model an earlier export left here
    const std::string name = entry.path().filename().string();
    if (name.rfind("model", 0) == 0 && (name.find(".safetensors") != std::string::npos)) fs::remove(entry.path());
  }
  auto get = [&](const std::string& param) {
    return without_padded_rows(model, param, read_model_tensor(ckpt, export_name(model, param)));
  };
  std::vector<std::vector<std::string>> files;  // the tensors of each file written
  std::map<std::string, at::Tensor> pending;
  double pending_bytes = 0, total_bytes = 0;
  auto temporary = [&](size_t k) { return dir + "/.model-" + std::to_string(k) + ".safetensors.partial"; };
  auto flush = [&] {
    files.emplace_back();
    for (const auto& [name, t] : pending) files.back().push_back(name);
    write_safetensors(temporary(files.size() - 1), NamedTensors(pending.begin(), pending.end()), {{"format", "pt"}});
    pending.clear();
    pending_bytes = 0;
  };
  for (int64_t part = 0; part < hf_llama_part_count(model); ++part) {
    for (auto& [name, t] : hf_llama_family_part(model, part, get)) {
      const double bytes = static_cast<double>(t.nbytes());
      pending_bytes += bytes, total_bytes += bytes;
      pending.emplace(name, std::move(t));
    }
    if (pending_bytes >= shard_bytes) flush();
  }
  if (!pending.empty() || files.empty()) flush();
  if (files.size() == 1) {
    fs::rename(temporary(0), dir + "/model.safetensors");
    return files.front().size();
  }
  size_t tensors = 0;
  nlohmann::json weight_map = nlohmann::json::object();
  for (size_t k = 0; k < files.size(); ++k) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", k + 1, files.size());
    fs::rename(temporary(k), dir + "/" + name);
    for (const std::string& tensor : files[k]) weight_map[tensor] = name;
    tensors += files[k].size();
  }
  const nlohmann::json index = {{"metadata", {{"total_size", static_cast<int64_t>(total_bytes)}}}, {"weight_map", weight_map}};
  write_file_durable(dir + "/model.safetensors.index.json", index.dump(2) + "\n");
  return tensors;
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
    double max_shard_mb = 5000;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("export", "write a checkpoint as one consolidated safetensors file");
  cmd->add_option("--checkpoint", args->checkpoint, "a step_N, checkpoints or run directory")->required();
  CLI::Option* out = cmd->add_option("--out", args->out, "the model file to write (e.g. model.safetensors)");
  cmd->add_option("--hf", args->hf, "write a Hugging Face folder (model, config.json, tokenizer) to this directory")
      ->excludes(out);
  cmd->add_option("--max-shard-mb", args->max_shard_mb,
                  "with --hf, a Llama-family model's files hold about this many MB each (more, a file per part: the "
                  "embedding, each block, the norm); a model larger than one is written in shards with "
                  "model.safetensors.index.json")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--optimizer", args->optimizer_out,
                  "also write the whole optimizer state (reassembled from the shards) to this file");
  return [args]() {
    require(!args->out.empty() || !args->hf.empty(), "export: give --out FILE or --hf DIR");
    const ModelOptions model = Config::from_checkpoint_meta(resolve_checkpoint_dir(args->checkpoint) + "/meta.json", {}).model;
    // A Llama-family folder is written part by part, its tensors read as each part asks for them.
    const bool in_parts = !args->hf.empty() && !uses_hf_gpt2_names(model) && hf_llama_family_refusal(model).empty();
    LoadedCheckpoint ckpt = load_checkpoint(args->checkpoint, !args->optimizer_out.empty(), {}, !in_parts);
    for (const char* param : {"wte.weight", "lm_head.weight"})
      if (auto it = ckpt.model.find(export_name(model, param)); it != ckpt.model.end())
        it->second = without_padded_rows(model, param, it->second);
    auto sorted = [](const std::map<std::string, at::Tensor>& tensors) {
      return NamedTensors(tensors.begin(), tensors.end());
    };
    if (!args->hf.empty()) {
      const std::string refusal = uses_hf_gpt2_names(model) ? "" : hf_llama_family_refusal(model);
      require(refusal.empty(), "export --hf: ", ckpt.dir, " holds a model that is neither GPT-2 nor of the Llama "
              "family (", refusal, "); use --out for a safetensors file of its own names");
      write_hf_folder(args->hf, model, ckpt.dir);
      args->out = args->hf + "/model.safetensors";
    }
    if (in_parts) {
      const size_t tensors = write_llama_family_model(ckpt, model, args->hf, args->max_shard_mb * 1e6);
      std::cout << "wrote " << args->hf << ": " << tensors << " tensors from " << ckpt.dir << "\n";
    } else {
      write_safetensors(args->out, sorted(ckpt.model), {{"format", "pt"}});
      std::cout << "wrote " << args->out << ": " << ckpt.model.size() << " tensors from " << ckpt.dir << "\n";
    }
    if (!args->optimizer_out.empty()) {
      write_safetensors(args->optimizer_out, sorted(ckpt.optimizer));
      std::cout << "wrote " << args->optimizer_out << ": " << ckpt.optimizer.size() << " tensors ("
                << ckpt.meta.value("optimizer_shards", int64_t{1}) << " shards)\n";
    }
    return 0;
  };
}

}  // namespace tessera::cli
