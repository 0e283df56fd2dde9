// The whole configuration of a run: one options struct per TOML section. The aggregate has a
// folder of its own, above the components whose options it holds (data/, model/, optim/,
// precision/; core/ holds the others) and below the layers that read the resolved config
// (parallelize(), the planner, the step runners, the training loop), so that none of them
// depends on the training loop and no component below it sees the aggregate. Its loading,
// checking and writing (the member functions below, config_reference, resolve_config_path) are in
// config/config.cpp, the one place that knows every section's checks; only the front door (cli/,
// train/) calls them.
//
// Loading order: the preset file (configs/<name>.toml, or any path), then `--set section.key=value`
// overrides, then checks. [model] applies model.preset first, so explicit keys refine a preset.
// Every key of every section is known here; anything else is refused by name.
//
// Each key's value has a source, kept in Config::sources: the config file that set it, the
// model.preset that shaped it, a --set override, or the checkpoint whose recorded config a resume
// reads; a key no one set holds its default. to_annotated_toml() writes every key with its source
// as a comment: the run directory's config.toml, printed at the start of every run and by
// `tessera train --dry-run`.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <toml++/toml.h>

#include "core/parallel_options.h"
#include "data/data_options.h"
#include "model/model_options.h"
#include "optim/optim_options.h"
#include "precision/precision_options.h"
#include "core/run_options.h"
#include "core/swarm_options.h"

namespace tessera {

struct Config {
  ModelOptions model;
  DataOptions data;
  TrainOptions train;
  OptimOptions optim;
  PrecisionOptions precision;
  EvalOptions eval;
  CheckpointOptions checkpoint;
  MemoryOptions memory;
  ParallelOptions parallel;
  SwarmOptions swarm;  // read by `tessera peer` only

  // "section.key" -> where its value came from (a file path, "--set", "checkpoint DIR"); keys
  // without an entry are defaults, or in [model] the preset's when model.preset is set.
  std::map<std::string, std::string> sources;

  // Calls f(section_name, options) for each section, in file order.
  template <class F>
  void for_each_section(F&& f) {
    f("model", model);
    f("data", data);
    f("train", train);
    f("optim", optim);
    f("precision", precision);
    f("eval", eval);
    f("checkpoint", checkpoint);
    f("memory", memory);
    f("parallel", parallel);
    f("swarm", swarm);
  }

  // `source` names the origin in error messages (a file path, or "checkpoint meta.json"); the keys
  // `root` sets are recorded in `sources` as coming from `origin` (default: `source`).
  static Config from_toml(const toml::table& root, const std::string& source, const std::string& origin = "");
  // `config` is a file path or a preset name (configs/<name>.toml).
  static Config load(const std::string& config, const std::vector<std::string>& overrides);
  // The config recorded in a checkpoint's meta.json (its "config" field, TOML text), with
  // `section.key=value` overrides applied.
  static Config from_checkpoint_meta(const std::string& meta_path, const std::vector<std::string>& overrides);

  // For a run that starts from the weights of checkpoint `init_dir` (train --init-from), whose
  // recorded config is `init`: [model] becomes init's (sources "init-from DIR"), except dropout
  // when this config sets it. A model key this config sets (file, preset or --set) to another
  // value is refused naming it: the weights fix the model.
  void adopt_model(const Config& init, const std::string& init_dir);

  void check(const std::string& source) const;
  toml::table to_toml() const;
  std::string to_toml_string() const;
  // Every key, one per line in declaration order, each followed by "# <source>"; valid TOML that
  // loads back to the same config.
  std::string to_annotated_toml() const;
  // Where `key` ("section.key") got its value: its entry in `sources`, "model.preset NAME", or
  // "default".
  std::string source_of(const std::string& key) const;
};

// Every key with its default and help, grouped by section (for --help).
std::string config_reference();

// The name itself when it is a path to a file; else <name>.toml in the preset directory: the first
// of $TESSERA_CONFIG_DIR, <bin>/configs, <bin>/../configs, <bin>/../share/tessera/configs that
// exists (relative to the running binary, never a compile-time path).
std::string resolve_config_path(const std::string& config);

// What a --config argument names, for messages: its resolved path, or "model preset <name>" when it
// is a model preset's name (model/model_options.h) that names no file or config preset of the preset
// directory found; Config::load then reads every default with model.preset = <name>.
std::string config_source(const std::string& config);

}  // namespace tessera
