// The activation policy's table and JSON (plan/activation_policy.h): what `tessera train` prints at
// start-up and `tessera bench --json` / `tessera plan --json` report.
#include <cstdio>

#include <nlohmann/json.hpp>

#include "core/byte_size.h"
#include "plan/activation_policy.h"

namespace tessera {

std::string describe_activation_policy(const ActivationPolicy& p) {
  char line[320];
  if (p.pipeline_rank < 0) {
    std::snprintf(line, sizeof line, "activation policy (memory.activation_policy = auto), per micro-batch:\n");
  } else {
    std::snprintf(line, sizeof line,
                  "activation policy (memory.activation_policy = auto), pipeline rank %lld (its schedule holds %.3g "
                  "micro-batches' activations at once), per micro-batch:\n",
                  static_cast<long long>(p.pipeline_rank), p.held);
  }
  std::string out = line;
  for (size_t l = 0; l < p.blocks.size();) {
    size_t end = l + 1;
    while (end < p.blocks.size() && p.layers[end] == p.layers[end - 1] + 1 && p.blocks[end].name() == p.blocks[l].name() &&
           p.blocks[end].bytes == p.blocks[l].bytes && p.blocks[end].seconds == p.blocks[l].seconds)
      ++end;
    const ActivationOption& o = p.blocks[l];
    const std::string blocks = end - l == 1 ? "block " + std::to_string(p.layers[l])
                                            : "blocks " + std::to_string(p.layers[l]) + "-" +
                                                  std::to_string(p.layers[end - 1]);
    std::snprintf(line, sizeof line, "  %-14s %-22s %12s on the device each, +%.2f ms each\n", blocks.c_str(),
                  o.name().c_str(), format_bytes(o.bytes).c_str(), 1e3 * o.seconds);
    out += line;
    l = end;
  }
  if (p.resident_micro_batches > 0) {
    std::snprintf(line, sizeof line,
                  "  held micro-batches: %lld (of a stage) kept on the device, every block of the others offloaded "
                  "(%.0f%% of the rank's forwards; %s reserved for their groups in flight)\n",
                  static_cast<long long>(p.resident_micro_batches), 100 * p.held_offloaded,
                  format_bytes(p.held_reserve).c_str());
    out += line;
  }
  const std::string of_what = p.with_swap_plan ? "chosen with the swap plan, both within memory.device_budget_gb"
                                               : "of the " + format_bytes(p.budget_bytes) +
                                                     " the budget leaves for activations";
  std::snprintf(line, sizeof line,
                "  total %s %s (%s; %lld offloaded groups in flight and one recomputed block included); +%.2f ms per "
                "micro-batch predicted\n",
                format_bytes(p.bytes).c_str(), of_what.c_str(), p.held == 1 ? "one micro-batch" : "the micro-batches held",
                static_cast<long long>(p.groups_in_flight), 1e3 * p.seconds);
  out += line;
  return out;
}

nlohmann::json activation_policy_json(const ActivationPolicy& p, int64_t micro_batches) {
  nlohmann::json blocks = nlohmann::json::array();
  for (size_t k = 0; k < p.blocks.size(); ++k) {
    const ActivationOption& o = p.blocks[k];
    blocks.push_back({{"layer", p.layers.at(k)},
                      {"option", o.name()},
                      {"checkpointing", o.checkpointing},
                      {"offload", o.offload},
                      {"compression", o.compression},
                      {"bytes", o.bytes},
                      {"awaiting_w_bytes", o.awaiting},
                      {"seconds", o.seconds}});
  }
  return {{"pipeline_rank", p.pipeline_rank},
          {"blocks", blocks},
          {"held", p.held},
          {"groups_in_flight", p.groups_in_flight},
          {"resident_micro_batches", p.resident_micro_batches},
          {"held_offloaded", p.held_offloaded},
          {"bytes", p.bytes},
          {"budget_bytes", p.budget_bytes},
          {"with_swap_plan", p.with_swap_plan},
          {"predicted_added_s_per_step", p.seconds * static_cast<double>(micro_batches)}};
}

}  // namespace tessera
