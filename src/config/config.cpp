#include "config/config.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_file.h"
#include "core/fs.h"
#include "core/options.h"
#include "core/resource_dir.h"

namespace tessera {
namespace fs = std::filesystem;

namespace {

// Where presets may live (core/fs.h's resource_search_path): $TESSERA_CONFIG_DIR, then beside
// the binary.
fs::path preset_dir() { return resource_dir("TESSERA_CONFIG_DIR", "configs"); }

std::vector<std::string> known_presets() { return resource_toml_names("TESSERA_CONFIG_DIR", "configs"); }

// A bare name of a model preset (model/model_options.h) that is neither a file nor a config
// preset: the config is every default with that model. Only where the preset directory was found:
// without it, a name such as tiny_gpt that is both would silently lose its config preset's keys.
bool names_model_preset_only(const std::string& config) {
  if (fs::exists(config) || config.find('/') != std::string::npos || config.find(".toml") != std::string::npos)
    return false;
  const fs::path dir = preset_dir();
  if (dir.empty() || fs::is_regular_file(dir / (config + ".toml"))) return false;
  const auto names = ModelOptions::preset_names();
  return std::find(names.begin(), names.end(), config) != names.end();
}

// Overrides were checked by apply_override: each is "section.key=value".
void mark_overrides(Config& config, const std::vector<std::string>& overrides) {
  for (const std::string& assignment : overrides) config.sources[assignment.substr(0, assignment.find('='))] = "--set";
}

// memory.activation_compression = adaptive probes each block of the model with autograd's
// gradients, without the owner's reductions (parallel/activation_probe.h): refused where the
// probing ranks' composition is not built (ZeRO-3 and ep beside model parallelism) and where the
// dispatch would save other tensors (hierarchical).
void check_adaptive_codecs(const Config& config, const std::string& source) {
  const ParallelOptions& parallel = config.parallel;
  const auto refuse = [&](bool bad, const std::string& key, const std::string& value, const char* why) {
    if (bad)
      fail(source, ": memory.activation_compression = adaptive does not run with ", key, " = ", value, ": ", why,
           " (docs/memory.md, \"Chosen per tensor\")");
  };
  refuse(parallel.zero_stage == 3 && parallel.tp * parallel.sp * parallel.pp * parallel.ep > 1, "parallel.zero_stage",
         "3", "under ZeRO-3 every replica probes beside data parallelism only, not with tp, sp, pp or ep (not built)");
  const bool experts = parallel.ep > 1;
  refuse(experts && parallel.tp * parallel.sp * parallel.pp > 1, "parallel.ep", std::to_string(parallel.ep),
         "its ep group probes together beside data parallelism only, not with tp, sp or pp (not built)");
  refuse(experts && parallel.ep_dispatch == "hierarchical", "parallel.ep_dispatch", "hierarchical",
         "its probe is built on the all-to-all dispatch (alltoall)");
  const ModelOptions& model = config.model;
  refuse(model.ffn == "moe" && model.moe_aux_scope == "global" &&
             (parallel.tp * parallel.pp * parallel.ep > 1 || parallel.zero_stage == 3),
         "model.moe_aux_scope", "global",
         "every data and sequence rank probes its own micro-batch beside dp and sp only, not with tp, pp, ep or "
         "ZeRO-3 (not built)");
}

}  // namespace

std::string resolve_config_path(const std::string& config) {
  // A FIFO, socket or device named as the config is refused as such (a directory of that name may
  // stand beside a preset's name: it falls through to the presets).
  if (fs::exists(config) && !fs::is_directory(config)) require_regular_file(config);
  if (fs::is_regular_file(config)) return config;
  const fs::path dir = preset_dir();
  const fs::path preset = dir / (config + ".toml");
  if (!dir.empty() && config.find('/') == std::string::npos && config.find(".toml") == std::string::npos &&
      fs::is_regular_file(preset))
    return preset.string();
  if (dir.empty()) {
    std::string searched;
    for (const std::string& d : resource_search_path("TESSERA_CONFIG_DIR", "configs"))
      searched += (searched.empty() ? "" : ", ") + d;
    fail(config, ": no such config file, and no preset directory was found (searched ", searched,
         "; set TESSERA_CONFIG_DIR to the configs/ directory)");
  }
  std::string list;
  for (const auto& name : known_presets()) list += (list.empty() ? "" : ", ") + name;
  std::string models;
  for (const auto& name : ModelOptions::preset_names()) models += (models.empty() ? "" : ", ") + name;
  fail(config, ": no such config file or preset in ", dir.string(), " (presets: ", list, "; or a model preset: ",
       models, ")");
}

std::string config_source(const std::string& config) {
  return names_model_preset_only(config) ? "model preset " + config : resolve_config_path(config);
}

Config Config::from_toml(const toml::table& root, const std::string& source, const std::string& origin) {
  Config config;
  std::set<std::string> sections;
  config.for_each_section([&](const char* name, auto& options) {
    sections.insert(name);
    const toml::node* node = root.get(name);
    if (node && !node->is_table()) fail(source, ": '", name, "' must be a [", name, "] section");
    const toml::table* table = node ? node->as_table() : nullptr;
    if constexpr (std::is_same_v<std::decay_t<decltype(options)>, ModelOptions>) {
      if (table) {
        if (const toml::node* preset = table->get("preset")) {
          auto name_value = preset->value_exact<std::string>();
          if (!name_value) fail(source, ": model.preset must be a string");
          if (!name_value->empty()) options = ModelOptions::from_preset(*name_value);
        }
      }
    }
    TomlSectionReader reader(table, name, source);
    options.visit(reader);
    reader.finish();
    for (const std::string& key : reader.assigned())
      config.sources[std::string(name) + "." + key] = origin.empty() ? source : origin;
  });
  for (const auto& [key, node] : root) {
    std::string name(key.str());
    if (sections.count(name)) continue;
    std::string hint = closest_key(name, sections);
    fail(source, ": unknown section '[", name, "]'", hint.empty() ? "" : " (did you mean '[" + hint + "]'?)");
  }
  config.check(source);
  return config;
}

Config Config::load(const std::string& config, const std::vector<std::string>& overrides) {
  const bool model_preset = names_model_preset_only(config);
  const std::string path = model_preset ? "model preset " + config : resolve_config_path(config);
  toml::table root = model_preset ? toml::table{{"model", toml::table{{"preset", config}}}} : parse_toml(read_file(path), path);
  for (const auto& assignment : overrides) apply_override(root, assignment);
  Config loaded = from_toml(root, overrides.empty() ? path : path + " with --set overrides", path);
  mark_overrides(loaded, overrides);
  return loaded;
}

Config Config::from_checkpoint_meta(const std::string& meta_path, const std::vector<std::string>& overrides) {
  const nlohmann::json meta = read_json_file(meta_path);
  if (!meta.contains("config") || !meta["config"].is_string()) fail(meta_path, ": has no config");
  toml::table root = parse_toml(meta["config"].get<std::string>(), meta_path + ": the recorded config");
  for (const auto& assignment : overrides) apply_override(root, assignment);
  Config loaded = from_toml(root, meta_path, "checkpoint " + fs::path(meta_path).parent_path().string());
  mark_overrides(loaded, overrides);
  return loaded;
}

void Config::adopt_model(const Config& init, const std::string& init_dir) {
  const toml::table mine = *to_toml()["model"].as_table(), theirs = *init.to_toml()["model"].as_table();
  auto text = [](const toml::node& node) {
    std::ostringstream out;
    node.visit([&out](const auto& value) { out << value; });
    return out.str();
  };
  const bool own_dropout = source_of("model.dropout") != "default";
  for (const auto& [key, value] : theirs) {
    const std::string name = "model." + std::string(key.str());
    if (name == "model.dropout" || name == "model.preset") continue;
    const toml::node* own = mine.get(key.str());
    if (source_of(name) != "default" && own && text(*own) != text(value))
      fail(name, " = ", text(*own), " (", source_of(name), ") disagrees with the model of --init-from ", init_dir, " (",
           name, " = ", text(value), "); the weights fix the model: drop the key or start without --init-from");
  }
  const double dropout = model.dropout;
  model = init.model;
  if (own_dropout) model.dropout = dropout;
  for (const auto& [key, value] : theirs) {
    const std::string name = "model." + std::string(key.str());
    if (name != "model.dropout" || !own_dropout) sources[name] = "init-from " + init_dir;
  }
  check("--init-from " + init_dir);
}

void Config::check(const std::string& source) const {
  model.check(source);
  data.check(source);
  train.check(source);
  optim.check(source);
  precision.check(source);
  eval.check(source);
  checkpoint.check(source);
  memory.check(source);
  parallel.check(source);
  swarm.check(source);
  if (train.seq_len > model.block_size)
    fail(source, ": train.seq_len = ", train.seq_len, " exceeds model.block_size = ", model.block_size);
  if (memory.activation_offload > model.n_layer)
    fail(source, ": memory.activation_offload = ", memory.activation_offload, " exceeds model.n_layer = ",
         model.n_layer, " (the blocks whose activations wait in host memory)");
  if (memory.activation_compression == "adaptive") check_adaptive_codecs(*this, source);
  if (memory.resident_micro_batches > 0) {
    require(parallel.pp > 1, source, ": memory.resident_micro_batches = ", memory.resident_micro_batches,
            " applies under a pipeline (parallel.pp > 1): without one a rank holds one micro-batch's activations at a "
            "time");
    require(memory.activation_policy == "manual", source,
            ": memory.resident_micro_batches is set by hand; under memory.activation_policy = auto the policy chooses "
            "it for each pipeline rank (docs/memory.md): leave it at 0");
  }
}

toml::table Config::to_toml() const {
  Config copy = *this;
  toml::table root;
  copy.for_each_section([&](const char* name, auto& options) {
    toml::table section;
    TomlSectionWriter writer(section);
    options.visit(writer);
    root.insert(name, std::move(section));
  });
  return root;
}

std::string Config::source_of(const std::string& key) const {
  if (auto it = sources.find(key); it != sources.end()) return it->second;
  if (key.rfind("model.", 0) == 0 && !model.preset.empty()) return "model.preset " + model.preset;
  return "default";
}

std::string Config::to_annotated_toml() const {
  Config copy = *this;
  std::string out;
  copy.for_each_section([&](const char* section, auto& options) {
    out += std::string(out.empty() ? "" : "\n") + "[" + section + "]\n";
    auto line = [&](const char* key, const auto& value, const char* help, auto&&... range) {
      std::string assignment;
      if constexpr (std::is_same_v<std::decay_t<decltype(value)>, double>) {
        // The shortest text that reads back as the same double (toml++ prints 17 digits: 0.1 as
        // 0.10000000000000001), with a decimal point so that TOML reads a float.
        char text[32];
        const auto end = std::to_chars(text, text + sizeof(text), value).ptr;
        std::string number(text, end);
        if (number.find_first_of(".en") == std::string::npos) number += ".0";
        assignment = std::string(key) + " = " + number;
      } else {
        toml::table one;
        TomlSectionWriter writer(one);
        writer(key, value, help, range...);
        std::ostringstream text;
        text << one;
        assignment = text.str();
      }
      const std::string source = source_of(std::string(section) + "." + key);
      if (assignment.size() < 40) assignment.resize(40, ' ');
      out += assignment + "  # " + source + "\n";
    };
    options.visit(line);
  });
  return out;
}

std::string Config::to_toml_string() const {
  std::ostringstream out;
  out << to_toml() << "\n";
  return out.str();
}

std::string config_reference() {
  Config defaults;
  std::string out;
  defaults.for_each_section([&](const char* name, auto& options) {
    out += std::string("[") + name + "]\n";
    HelpWriter writer(name, out);
    options.visit(writer);
  });
  return out;
}

void TrainOptions::check(const std::string& source) const {
  check_ranges(*this, "train", source);
  require(device == "cpu" || device.rfind("cuda", 0) == 0, source, ": train.device must be cpu, cuda or cuda:N (got '",
          device, "')");
}

void EvalOptions::check(const std::string& source) const { check_ranges(*this, "eval", source); }

void CheckpointOptions::check(const std::string& source) const { check_ranges(*this, "checkpoint", source); }

void MemoryOptions::check(const std::string& source) const {
  check_ranges(*this, "memory", source);
  require(activation_checkpointing == "none" || activation_checkpointing == "full" ||
              activation_checkpointing == "selective",
          source, ": memory.activation_checkpointing must be none, full or selective (got '", activation_checkpointing,
          "')");
  // One codec, adaptive, or under activation_policy = auto a comma-separated list the blocks choose from.
  std::vector<std::string> codecs;
  const bool adaptive = activation_compression == "adaptive";
  for (size_t begin = 0; !adaptive && begin <= activation_compression.size();) {
    const size_t end = std::min(activation_compression.find(',', begin), activation_compression.size());
    const std::string codec = activation_compression.substr(begin, end - begin);
    require(codec == "none" || codec == "lossless" || codec == "bf16" || codec == "fp8" || codec == "int8" ||
                codec == "int4",
            source, ": memory.activation_compression must be none, lossless, bf16, fp8, int8, int4 or adaptive, or "
            "under activation_policy = auto a comma-separated list of the codecs (got '", activation_compression, "')");
    require(std::find(codecs.begin(), codecs.end(), codec) == codecs.end() &&
                (codec != "none" || activation_compression == "none"),
            source, ": memory.activation_compression = '", activation_compression,
            "': a list of codecs names each once and not none");
    codecs.push_back(codec);
    begin = end + 1;
  }
  require(adaptive || activation_bits == 6, source, ": memory.activation_bits = ", activation_bits,
          " applies with memory.activation_compression = adaptive only");
  require(adaptive || activation_probe_every == 500, source, ": memory.activation_probe_every = ",
          activation_probe_every, " applies with memory.activation_compression = adaptive only");
  if (adaptive) {
    require(activation_policy == "manual", source,
            ": memory.activation_compression = adaptive chooses a codec for each saved tensor; memory.activation_policy "
            "= auto chooses one per block: use one of them");
    require(attention_compression == "same", source, ": memory.attention_compression = ", attention_compression,
            ": under memory.activation_compression = adaptive the attention core's tensors are chosen with the rest; "
            "leave it at same");
  }
  require(adaptive || codecs.size() == 1 || activation_policy == "auto", source, ": memory.activation_compression = '",
          activation_compression, "' lists codecs for memory.activation_policy = auto to choose from per block; with "
          "activation_policy = manual name one");
  require(attention_compression == "same" || attention_compression == "none" || attention_compression == "lossless" ||
              attention_compression == "bf16" || attention_compression == "fp8" || attention_compression == "int8" ||
              attention_compression == "int4",
          source, ": memory.attention_compression must be same, none, lossless, bf16, fp8, int8 or int4 (got '",
          attention_compression, "')");
  require(!swap || device_budget_gb > 0, source, ": memory.swap = true needs memory.device_budget_gb, the device "
          "memory the swap plan may use (GiB)");
  require(activation_policy == "manual" || activation_policy == "auto", source,
          ": memory.activation_policy must be manual or auto (got '", activation_policy, "')");
  require(swap || swap_blocks.empty(), source, ": memory.swap_blocks applies with memory.swap = true only");
  require(swap || activation_policy == "auto" || device_budget_gb == 0, source,
          ": memory.device_budget_gb applies with memory.swap = true or memory.activation_policy = auto only");
  if (activation_policy == "auto") {
    require(device_budget_gb > 0, source, ": memory.activation_policy = auto needs memory.device_budget_gb, the "
            "device memory (GiB) the model's state and the blocks' activations may use");
    require(activation_checkpointing == "none" && activation_offload == 0, source,
            ": memory.activation_policy = auto chooses each block's checkpointing and offload; leave "
            "memory.activation_checkpointing (", activation_checkpointing, ") and memory.activation_offload (",
            activation_offload, ") at none and 0");
  }
  require(swap_copies == "auto" || swap_copies == "fp32" || swap_copies == "bf16", source,
          ": memory.swap_copies must be auto, fp32 or bf16 (got '", swap_copies, "')");
  for (int64_t b : swap_blocks)
    require(b >= 1, source, ": memory.swap_blocks entries must be at least 1 block (got ", b, ")");
}

void SwarmOptions::check(const std::string& source) const {
  check_ranges(*this, "swarm", source);
  require(sync == "batch" || sync == "diloco", source, ": swarm.sync must be batch or diloco (got '", sync, "')");
  require(overlap_rounds == "always" || overlap_rounds == "never" || overlap_rounds == "auto", source,
          ": swarm.overlap_rounds must be always, never or auto (got '", overlap_rounds, "')");
  require(mean_all_reduce == "butterfly" || mean_all_reduce == "ring", source,
          ": swarm.mean_all_reduce must be butterfly or ring (got '", mean_all_reduce, "')");
  require(aggregation == "mean" || aggregation == "centered_clip" || aggregation == "trimmed_mean" ||
              aggregation == "median",
          source, ": swarm.aggregation must be mean, centered_clip, trimmed_mean or median (got '", aggregation, "')");
  require(aggregation == "centered_clip" || clip_radius == 2, source, ": swarm.clip_radius = ", clip_radius,
          " applies with swarm.aggregation = centered_clip only");
  require(aggregation == "trimmed_mean" || trim_fraction == 0.25, source, ": swarm.trim_fraction = ", trim_fraction,
          " applies with swarm.aggregation = trimmed_mean only");
  require(pseudo_gradient_dtype == "fp32" || pseudo_gradient_dtype == "bf16" || pseudo_gradient_dtype == "int8", source,
          ": swarm.pseudo_gradient_dtype must be fp32, bf16 or int8 (got '", pseudo_gradient_dtype, "')");
  require(sync == "diloco" || topk_ratio == 1, source, ": swarm.topk_ratio = ", topk_ratio,
          " applies to swarm.sync = diloco only (batch mode averages exact gradients)");
  require(sync == "diloco" || pseudo_gradient_rank == 0, source, ": swarm.pseudo_gradient_rank = ",
          pseudo_gradient_rank, " applies to swarm.sync = diloco only (batch mode averages exact gradients)");
  require(topk_ratio == 1 || pseudo_gradient_rank == 0, source, ": swarm.topk_ratio = ", topk_ratio,
          " and swarm.pseudo_gradient_rank = ", pseudo_gradient_rank, " are two ways to compress the rounds; pick one");
  require(topk_ratio < 1 || pseudo_gradient_rank > 0 || error_feedback_decay == 1, source,
          ": swarm.error_feedback_decay = ", error_feedback_decay,
          " applies with swarm.topk_ratio < 1 or swarm.pseudo_gradient_rank > 0 only (dense rounds keep no residual)");
  require(round_timeout_min_s <= round_timeout_max_s, source, ": swarm.round_timeout_min_s = ", round_timeout_min_s,
          " exceeds swarm.round_timeout_max_s = ", round_timeout_max_s);
  require(publish_interval_s < record_ttl_s, source, ": swarm.publish_interval_s = ", publish_interval_s,
          " must be below swarm.record_ttl_s = ", record_ttl_s, " (a live peer's record would expire between two)");
}

}  // namespace tessera
