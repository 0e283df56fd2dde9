// The optimizer factory and the state-loading check shared by every optimizer.
#include "optim/optimizer.h"

#include <set>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include "core/error.h"
#include "optim/adafactor.h"
#include "optim/adamw.h"
#include "optim/sgd.h"

namespace tessera {

std::string parameter_of_state(const std::string& state_name) {
  const size_t dot = state_name.rfind('.');
  return dot == std::string::npos ? "" : state_name.substr(0, dot);
}

Optimizer::~Optimizer() = default;

StateKind Optimizer::state_kind(const std::string& state_name) const {
  const std::string param = parameter_of_state(state_name);
  const std::string slot = param.empty() ? state_name : state_name.substr(param.size() + 1);
  return slot == "step" ? StateKind::counter : slot_kind(slot);
}

StateKind Optimizer::slot_kind(const std::string&) const { return StateKind::real; }

std::unique_ptr<Optimizer> make_optimizer(const OptimOptions& options, NamedParams named_params,
                                          std::vector<bool> decay) {
  if (options.name == "adamw") return std::make_unique<AdamW>(options, std::move(named_params), std::move(decay));
  if (options.name == "sgd") return std::make_unique<SGD>(options, std::move(named_params), std::move(decay));
  require(decay.empty(), "internal: optim.name = adafactor takes no per-parameter weight-decay flags");
  if (options.name == "adafactor") return std::make_unique<Adafactor>(options, std::move(named_params));
  fail("optim.name must be adamw, adafactor or sgd (got ", options.name, ")");
}

ElementwiseState elementwise_state(const OptimOptions& options) {
  if (options.name == "adamw") return {true, {"exp_avg", "exp_avg_sq"}, true};
  if (options.name == "sgd") {
    if (options.momentum == 0) return {true, {}, false};
    return {true, {"momentum_buffer"}, true};
  }
  return {false, {}, false};
}

void load_named_state(const NamedParams& live, const std::map<std::string, at::Tensor>& given,
                      const std::string& source) {
  for (const auto& [name, tensor] : live) {
    auto it = given.find(name);
    require(it != given.end(), source, ": optimizer state ", name, " is missing");
    require(it->second.sizes() == tensor.sizes(), source, ": optimizer state ", name, " has shape ",
            it->second.sizes(), ", expected ", tensor.sizes());
  }
  if (given.size() != live.size()) {
    std::set<std::string> known;
    for (const auto& entry : live) known.insert(entry.first);
    for (const auto& entry : given)
      require(known.count(entry.first) > 0, source, ": unexpected optimizer state ", entry.first,
              " (no such parameter slot)");
  }
  at::NoGradGuard no_grad;
  for (const auto& [name, tensor] : live) {
    at::Tensor target = tensor;
    target.copy_(given.at(name));
  }
}

}  // namespace tessera
