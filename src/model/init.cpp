// Per-parameter seeded initialisation (init.h).
#include "model/init.h"

#include <mutex>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/module.h>
#include <torch/utils.h>

#include "core/error.h"
#include "core/splitmix.h"

namespace tessera {
namespace {

// FNV-1a over the name, mixed with the seed by splitmix64: stable across builds and platforms.
uint64_t mix(uint64_t seed, const std::string& name) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ull;
  return splitmix64(seed + h);
}

}  // namespace

at::Tensor initial_value(const ParameterInit& init, const std::string& name, at::IntArrayRef shape, uint64_t seed) {
  switch (init.kind) {
    case ParameterInit::Kind::zeros: return at::zeros(shape, at::kFloat);
    case ParameterInit::Kind::ones: return at::ones(shape, at::kFloat);
    case ParameterInit::Kind::normal: {
      at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(mix(seed, name));
      at::Tensor values = at::empty(shape, at::TensorOptions().dtype(at::kFloat));
      values.normal_(0.0, init.std, gen);
      return values;
    }
  }
  fail("internal: parameter ", name, " has an unknown initialisation");
}

void initialize_parameters(torch::nn::Module& module, const ParameterSpecs& specs, uint64_t seed) {
  torch::NoGradGuard no_grad;
  for (auto& item : module.named_parameters()) {
    const auto spec = specs.find(item.key());
    require(spec != specs.end(), "internal: parameter ", item.key(), " has no declaration (model/parameter_spec.h)");
    at::Tensor& p = item.value();
    if (p.is_meta()) continue;
    switch (spec->second.init.kind) {
      case ParameterInit::Kind::zeros: p.zero_(); break;
      case ParameterInit::Kind::ones: p.fill_(1.0); break;
      case ParameterInit::Kind::normal: p.copy_(initial_value(spec->second.init, item.key(), p.sizes(), seed)); break;
    }
  }
}

uint64_t draw_model_seed() {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get<at::CPUGeneratorImpl>()->random64();
}

}  // namespace tessera
