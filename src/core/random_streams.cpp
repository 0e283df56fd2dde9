// Random streams: seeding, the model-parallel fork and the states checkpoints keep
// (random_streams.h).
#include "core/random_streams.h"

#include <map>
#include <mutex>

#include <ATen/Context.h>
#include <ATen/core/Generator.h>

#include "core/error.h"
#include "core/splitmix.h"

namespace tessera::random {
namespace {

struct ModelParallel {
  std::mutex mutex;
  uint64_t seed = splitmix64(0);
  std::map<std::pair<int, int>, at::Tensor> states;  // by device: (type, index)
};

ModelParallel& model_parallel() {
  static ModelParallel mp;
  return mp;
}

const char* type_name(const c10::Device& d) { return d.is_cuda() ? "cuda" : "cpu"; }
std::pair<int, int> key(const c10::Device& d) { return {static_cast<int>(d.type()), static_cast<int>(d.index())}; }

// The model-parallel state of `device`, created from the seed on first use. `gen` is the device's
// default generator, locked by the caller (creating a state seeds it, then restores it).
at::Tensor model_parallel_state(at::Generator& gen, c10::Device device) {
  ModelParallel& mp = model_parallel();
  std::lock_guard<std::mutex> lock(mp.mutex);
  auto it = mp.states.find(key(device));
  if (it != mp.states.end()) return it->second;
  const at::Tensor saved = gen.get_state();
  gen.set_current_seed(mp.seed);
  at::Tensor state = gen.get_state();
  gen.set_state(saved);
  mp.states[key(device)] = state;
  return state;
}

void store_model_parallel_state(c10::Device device, at::Tensor state) {
  ModelParallel& mp = model_parallel();
  std::lock_guard<std::mutex> lock(mp.mutex);
  mp.states[key(device)] = std::move(state);
}

std::vector<c10::Device> devices(std::optional<c10::Device> cuda) {
  std::vector<c10::Device> out{c10::Device(c10::kCPU)};
  if (cuda) out.push_back(*cuda);
  return out;
}

}  // namespace

void seed_streams(uint64_t seed, int64_t replica, int64_t tp_rank, std::optional<c10::Device> cuda) {
  const uint64_t shared = splitmix64(splitmix64(seed) + static_cast<uint64_t>(replica) + 1);
  const uint64_t own = splitmix64(splitmix64(seed ^ 0x2718281828459045ULL) + (static_cast<uint64_t>(replica) << 24) +
                           static_cast<uint64_t>(tp_rank) + 1);
  for (const c10::Device& device : devices(cuda)) {
    at::Generator gen = at::globalContext().defaultGenerator(device);
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_current_seed(shared);
  }
  ModelParallel& mp = model_parallel();
  std::lock_guard<std::mutex> lock(mp.mutex);
  mp.seed = own;
  mp.states.clear();
}

at::Tensor fork(Stream stream, c10::Device device, const std::function<at::Tensor()>& fn) {
  if (stream == Stream::shared) return fn();
  at::Generator gen = at::globalContext().defaultGenerator(device);
  at::Tensor saved;
  {
    std::lock_guard<std::mutex> lock(gen.mutex());
    saved = gen.get_state();
    gen.set_state(model_parallel_state(gen, device));
  }
  auto swap_back = [&] {
    std::lock_guard<std::mutex> lock(gen.mutex());
    store_model_parallel_state(device, gen.get_state());
    gen.set_state(saved);
  };
  at::Tensor out;
  try {
    out = fn();
  } catch (...) {
    swap_back();
    throw;
  }
  swap_back();
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> states(std::optional<c10::Device> cuda) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const c10::Device& device : devices(cuda)) {
    at::Generator gen = at::globalContext().defaultGenerator(device);
    std::lock_guard<std::mutex> lock(gen.mutex());
    out.emplace_back(std::string("shared.") + type_name(device), gen.get_state());
    out.emplace_back(std::string("model_parallel.") + type_name(device), model_parallel_state(gen, device));
  }
  return out;
}

void load_states(const std::vector<std::pair<std::string, at::Tensor>>& states, std::optional<c10::Device> cuda,
                 const std::string& source) {
  for (const auto& [name, state] : states) {
    const auto dot = name.find('.');
    const std::string stream = name.substr(0, dot), type = dot == std::string::npos ? "" : name.substr(dot + 1);
    require((stream == "shared" || stream == "model_parallel") && (type == "cpu" || type == "cuda"), source,
            ": unknown random stream state '", name, "'");
    require(type == "cpu" || cuda, source, ": random stream state '", name,
            "' is for a CUDA device, and this run has none");
    const c10::Device device = type == "cpu" ? c10::Device(c10::kCPU) : *cuda;
    at::Generator gen = at::globalContext().defaultGenerator(device);
    std::lock_guard<std::mutex> lock(gen.mutex());
    const at::Tensor current = gen.get_state();
    require(state.scalar_type() == current.scalar_type() && state.sizes() == current.sizes(), source,
            ": random stream state '", name, "' is ", state.scalar_type(), " ", state.sizes(), ", this build's ",
            type, " generator keeps ", current.scalar_type(), " ", current.sizes());
    if (stream == "shared")
      gen.set_state(state);
    else
      store_model_parallel_state(device, state.clone());
  }
}

}  // namespace tessera::random
