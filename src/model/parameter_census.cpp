// Memoised meta-device parameter lists (parameter_census.h).
#include "model/parameter_census.h"

#include <map>
#include <mutex>
#include <sstream>

#include "core/options.h"

namespace tessera {
namespace {

std::string key_of(const ModelOptions& model, const ModelStage& stage) {
  toml::table table;
  TomlSectionWriter writer(table);
  ModelOptions copy = model;  // visit() hands out mutable references
  copy.visit(writer);
  std::ostringstream key;
  key << table << "\n";
  for (const auto& [first, end] : stage.chunks) key << first << "-" << end << ";";
  return key.str();
}

}  // namespace

std::shared_ptr<const ParameterCensus> parameter_census(const ModelOptions& model, const ModelStage& stage) {
  static std::mutex mutex;
  static std::map<std::string, std::shared_ptr<const ParameterCensus>> built;
  const std::string key = key_of(model, stage);
  {
    std::lock_guard<std::mutex> lock(mutex);
    const auto it = built.find(key);
    if (it != built.end()) return it->second;
  }
  const TransformerLM meta(model, stage, at::TensorOptions().device(at::kMeta));
  auto census = std::make_shared<ParameterCensus>();
  const ParameterSpecs specs = meta->parameter_specs();
  for (const auto& item : meta->named_parameters()) census->push_back({item.key(), specs.at(item.key()), item.value()});
  std::lock_guard<std::mutex> lock(mutex);
  return built.emplace(key, std::move(census)).first->second;
}

}  // namespace tessera
