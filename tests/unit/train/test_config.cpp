// The config's ranges: every numeric key of every section has one (the visitors have no numeric
// overload without it), the defaults and presets lie inside, and a value outside is refused by
// name whether it comes from a file or from code.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "core/error.h"
#include "model/model_options.h"
#include "test_util.h"
#include "config/config.h"

namespace tessera {
namespace {

struct NumericKey {
  std::string section, key;
  bool integer;
  Range range;
};

std::vector<NumericKey> numeric_keys() {
  std::vector<NumericKey> keys;
  Config config;
  config.for_each_section([&](const char* section, auto& options) {
    struct Collect {
      const char* section;
      std::vector<NumericKey>& keys;
      void operator()(const char* key, int64_t&, const char*, const Range& r) { keys.push_back({section, key, true, r}); }
      void operator()(const char* key, double&, const char*, const Range& r) { keys.push_back({section, key, false, r}); }
      void operator()(const char*, bool&, const char*) {}
      void operator()(const char*, std::string&, const char*) {}
      void operator()(const char*, std::vector<std::string>&, const char*) {}
      void operator()(const char*, std::vector<int64_t>&, const char*) {}
    } collect{section, keys};
    options.visit(collect);
  });
  return keys;
}

TEST(ConfigRanges, DefaultsAndPresetsLieInside) {
  EXPECT_GT(numeric_keys().size(), 55u);
  EXPECT_NO_THROW(Config().check("defaults"));
  for (const std::string& name : ModelOptions::preset_names())
    EXPECT_NO_THROW(ModelOptions::from_preset(name).check(name)) << name;
}

// Both ends of every key: just past a closed end, or on an open one.
TEST(ConfigRanges, EveryNumericKeyRefusesValuesOutsideItsRange) {
  for (const NumericKey& k : numeric_keys()) {
    const Range& r = k.range;
    const double past_max = r.max_open ? r.max : r.max + std::max(1.0, std::fabs(r.max));
    const double past_min = r.min_open ? r.min : r.min - std::max(1.0, std::fabs(r.min));
    for (double value : {past_max, past_min}) {
      toml::table root;
      toml::table section;
      section.insert(k.key, value);
      root.insert(k.section, section);
      const std::string name = k.section + "." + k.key;
      EXPECT_TRUE(test::throws_naming([&] { Config::from_toml(root, "run.toml"); },
                                      {"run.toml: " + name, "outside its range " + r.describe()}))
          << name << " = " << value;
    }
  }
}

TEST(ConfigRanges, OptionsBuiltInCodeAreHeldToTheSameRanges) {
  Config config;
  config.train.threads = 2000;
  EXPECT_TRUE(test::throws_naming([&] { config.check("code"); }, {"code: train.threads = 2000", "[0, 1024]"}));
  config = Config();
  config.optim.lr = 1e30;
  EXPECT_TRUE(test::throws_naming([&] { config.check("code"); }, {"optim.lr", "(0, 10]"}));
}

// memory.activation_offload counts blocks: more than the model has is refused by key.
TEST(ConfigRanges, ActivationOffloadBeyondTheModelsBlocksIsRefused) {
  Config config;
  config.memory.activation_offload = config.model.n_layer;
  EXPECT_NO_THROW(config.check("code"));
  config.memory.activation_offload = config.model.n_layer + 1;
  EXPECT_TRUE(test::throws_naming([&] { config.check("code"); },
                                  {"code: memory.activation_offload = " + std::to_string(config.model.n_layer + 1),
                                   "exceeds model.n_layer"}));
}

// memory.resident_micro_batches is a pipeline rank's: refused by key without one, and beside the
// activation policy (which chooses it).
TEST(ConfigRanges, ResidentMicroBatchesNeedAPipelineAndAHandMadePolicy) {
  Config config;
  config.memory.resident_micro_batches = 1;
  EXPECT_TRUE(test::throws_naming([&] { config.check("code"); },
                                  {"code: memory.resident_micro_batches = 1", "parallel.pp > 1"}));
  config.parallel.pp = 2;
  EXPECT_NO_THROW(config.check("code"));
  config.memory.activation_policy = "auto";
  config.memory.device_budget_gb = 1;
  EXPECT_TRUE(test::throws_naming([&] { config.check("code"); },
                                  {"memory.resident_micro_batches", "memory.activation_policy = auto"}));
}

// memory.activation_compression = adaptive: its two keys apply with it only, and the layouts whose
// blocks its probe cannot run alone, each refused naming its key (docs/memory.md, "Chosen per
// tensor").
TEST(ConfigRanges, AdaptiveCodecsNameTheLayoutsTheirProbeCannotRun) {
  Config config;
  config.memory.activation_bits = 7;
  EXPECT_TRUE(test::throws_naming([&] { config.check("code"); },
                                  {"code: memory.activation_bits = 7", "activation_compression = adaptive only"}));
  config.memory.activation_compression = "adaptive";
  EXPECT_NO_THROW(config.check("code"));
  config.memory.activation_bits = 4;
  EXPECT_TRUE(test::throws_naming([&] { config.check("code"); }, {"memory.activation_bits"}));
  config.memory.activation_bits = 7;
  Config with_dropout = config;  // the probe draws the census's masks again (parallel/activation_probe.h)
  with_dropout.model.dropout = 0.1;
  EXPECT_NO_THROW(with_dropout.check("code"));
  Config sequence_parallel = config;  // the sp group probes together
  sequence_parallel.parallel.sp = 2;
  EXPECT_NO_THROW(sequence_parallel.check("code"));
  Config offloaded = config;  // the probe's passes store and fetch their groups as a step does
  offloaded.memory.activation_offload = 1;
  EXPECT_NO_THROW(offloaded.check("code"));
  Config experts = config;  // stacked experts: the same saved tensors whatever the routing
  experts.model.ffn = "moe";
  EXPECT_NO_THROW(experts.check("code"));
  Config pipelined = config;  // the pipeline ranks probe their stages and choose one table
  pipelined.parallel.pp = 2;
  EXPECT_NO_THROW(pipelined.check("code"));
  Config expert_parallel = experts;  // the ep group probes one micro-batch together
  expert_parallel.parallel.ep = 2;
  EXPECT_NO_THROW(expert_parallel.check("code"));
  Config swapped = config;  // the probe loads each sub-model around its passes
  swapped.memory.swap = true;
  swapped.memory.device_budget_gb = 1;
  EXPECT_NO_THROW(swapped.check("code"));
  Config balanced = experts;  // the probe routes on its own counts, its forwards not counted
  balanced.model.moe_aux_scope = "global";
  balanced.model.moe_bias_update_rate = 0.001;
  EXPECT_NO_THROW(balanced.check("code"));
  Config zero3 = config;  // every replica probes, one block gathered at a time
  zero3.parallel.zero_stage = 3;
  EXPECT_NO_THROW(zero3.check("code"));
  const std::vector<std::pair<std::function<void(Config&)>, std::string>> refused{
      {[](Config& c) {
         c.parallel.zero_stage = 3;
         c.parallel.tp = 2;
       },
       "parallel.zero_stage = 3"},
      {[](Config& c) {
         c.model.ffn = "moe";
         c.parallel.ep = 2;
         c.parallel.tp = 2;
       },
       "parallel.ep = 2"},
      {[](Config& c) {
         c.model.ffn = "moe";
         c.parallel.ep = 2;
         c.parallel.ep_dispatch = "hierarchical";
       },
       "parallel.ep_dispatch = hierarchical"},
      {[](Config& c) {
         c.model.ffn = "moe";
         c.model.moe_aux_scope = "global";
         c.parallel.tp = 2;
       },
       "model.moe_aux_scope = global"},
      {[](Config& c) { c.memory.attention_compression = "int8"; }, "memory.attention_compression = int8"},
  };
  for (const auto& [set, key] : refused) {
    Config c = config;
    set(c);
    EXPECT_TRUE(test::throws_naming([&] { c.check("code"); }, {"code: ", key})) << key;
  }
}

}  // namespace
}  // namespace tessera
