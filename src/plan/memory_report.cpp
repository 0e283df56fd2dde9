// Describing a memory estimate as text and refusing one that cannot fit (memory_estimate.h).
#include "plan/memory_estimate.h"

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <fstream>
#include <string>

#include "core/byte_size.h"
#include "core/error.h"
#include "memory/activation_codec.h"
#include "plan/activation_policy.h"
#include "model/transformer.h"

namespace tessera {
namespace {

std::string line(const char* format, ...) __attribute__((format(printf, 1, 2)));
std::string line(const char* format, ...) {
  char text[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(text, sizeof(text), format, args);
  va_end(args);
  return text;
}

}  // namespace

std::string format_count(int64_t n) {
  char out[32];
  if (n >= 1000000000)
    std::snprintf(out, sizeof(out), "%.2fB", static_cast<double>(n) / 1e9);
  else if (n >= 1000000)
    std::snprintf(out, sizeof(out), "%.2fM", static_cast<double>(n) / 1e6);
  else
    std::snprintf(out, sizeof(out), "%lld", static_cast<long long>(n));
  return out;
}

std::string describe_memory_estimate(const Config& config, const ParallelDims& dims, const MemoryEstimate& e) {
  const ModelOptions& m = config.model;
  const ParallelOptions& p = config.parallel;
  std::string out;
  out += line("model: arch %s, ffn %s, %lld blocks, n_embd %lld, %lld heads (%lld key/value), head width %lld, "
              "vocab %lld, block_size %lld; %s, %s positions, %s MLP %lld wide\n",
              m.arch.c_str(), m.ffn.c_str(), static_cast<long long>(m.n_layer), static_cast<long long>(m.n_embd),
              static_cast<long long>(m.n_head), static_cast<long long>(m.kv_heads()),
              static_cast<long long>(m.head_width()), static_cast<long long>(m.vocab_size),
              static_cast<long long>(m.block_size), m.rms_norm() ? "RMSNorm" : "LayerNorm",
              m.rotary() ? "rotary" : m.learned_positions() ? "learned" : "no", m.swiglu() ? "SwiGLU" : "GELU",
              static_cast<long long>(m.hidden()));
  if (m.ffn == "moe") {
    int64_t moe_blocks = 0;
    for (int64_t l = 0; l < m.n_layer; ++l) moe_blocks += m.is_moe_block(l) ? 1 : 0;
    out += line("experts: %lld MoE blocks of %lld experts %lld wide, top %lld by %s scores (%s)%s, %s\n",
                static_cast<long long>(moe_blocks), static_cast<long long>(m.moe_experts),
                static_cast<long long>(m.expert_hidden()), static_cast<long long>(m.moe_top_k), m.moe_score.c_str(),
                m.renormalized_gates() ? "renormalized" : "as they are",
                m.moe_shared_experts > 0 ? line(", %lld shared", static_cast<long long>(m.moe_shared_experts)).c_str() : "",
                m.moe_capacity_factor > 0 ? line("capacity factor %g", m.moe_capacity_factor).c_str() : "dropless");
  }
  out += line("parameters: %s (%lld)", format_count(e.parameters_total).c_str(), static_cast<long long>(e.parameters_total));
  for (const auto& [component, n] : e.parameters_by_component)
    out += line(", %s %s", component.c_str(), format_count(n).c_str());
  out += m.tie_embeddings ? "; the head (ln_f) computes logits with the token embedding\n"
                          : "; the head (ln_f, lm_head) has its own output matrix\n";
  const std::string compression =
      (config.memory.activation_compression == "none" ? "" : ", activation compression " + config.memory.activation_compression) +
      (config.memory.attention_compression == "same" ? "" : ", the attention core's " + config.memory.attention_compression);
  out += line("layout: %s, zero_stage %lld%s, precision %s, optimizer %s, activation checkpointing %s%s\n",
              dims.describe().c_str(), static_cast<long long>(p.zero_stage), p.offload ? " with offload" : "",
              config.precision.dtype.c_str(), config.optim.name.c_str(), config.memory.activation_checkpointing.c_str(),
              compression.c_str());
  out += e.pipeline;
  if (e.pipeline_rank >= 0)
    out += line("per rank (the largest: pipeline rank %lld, %s parameters after tensor/expert parallelism, activations of "
                "up to %lld micro-batches x one stage held by its schedule):\n",
                static_cast<long long>(e.pipeline_rank), format_count(e.parameters_rank).c_str(),
                static_cast<long long>(e.pipeline_held));
  else
    out += line("per rank (%s parameters after tensor/expert parallelism):\n", format_count(e.parameters_rank).c_str());
  out += line("  parameters       %12s\n", format_bytes(e.parameter_bytes).c_str());
  out += line("  gradients        %12s\n", format_bytes(e.gradient_bytes).c_str());
  out += line("  optimizer state  %12s%s\n", format_bytes(e.optimizer_bytes).c_str(), e.optimizer_on_host ? " (host)" : "");
  out += line(e.pipeline_rank >= 0 ? "  activations      %12s at the schedule's peak, micro-batches of %lld x %lld tokens (%s per token)\n"
                                   : "  activations      %12s per micro-batch of %lld x %lld tokens (%s per token)\n",
              format_bytes(e.activation_bytes_per_micro_batch).c_str(), static_cast<long long>(config.train.batch_size),
              static_cast<long long>(config.train.seq_len / dims.sp()), format_bytes(e.activation_bytes_per_token).c_str());
  if (config.memory.resident_micro_batches > 0 && e.pipeline_rank >= 0)
    out += line("  held offloaded   %12s of activations in host memory (memory.resident_micro_batches = %lld: the "
                "micro-batches held beyond it, with the blocks memory.activation_offload names; the device term "
                "holds 2 + its stages of their block groups in flight)\n",
                format_bytes(e.activation_host_bytes).c_str(),
                static_cast<long long>(config.memory.resident_micro_batches));
  else if (config.memory.activation_offload > 0)
    out += line("  offloaded        %12s of activations in host memory (memory.activation_offload = %lld blocks; the "
                "device term holds two of them in flight)\n",
                format_bytes(e.activation_host_bytes).c_str(), static_cast<long long>(config.memory.activation_offload));
  if (e.working_bytes > 0)
    out += line("  backward working %12s (the head's logits and gradients, or the last block's)\n",
                format_bytes(e.working_bytes).c_str());
  if (e.in_flight_bytes > 0)
    out += line("  in flight (ZeRO) %12s ZeRO-3's gathered units and ZeRO-2/3's reduce-scatters at the backward's peak\n",
                format_bytes(e.in_flight_bytes).c_str());
  if (e.weight_copy_bytes > 0)
    out += line("  bf16 weight copies %10s kept by the products for their backward (one set for a pipeline step's micro-batches; one per held micro-batch under ZeRO-3 in a pipeline)\n",
                format_bytes(e.weight_copy_bytes).c_str());
  if (e.offload_host_bytes > 0)
    out += line("  offload copies   %12s (host: the shard's float32 master copy and gradient)\n",
                format_bytes(e.offload_host_bytes).c_str());
  out += line(e.gradients_at_peak ? "  device total     %12s at the backward's peak\n"
                                  : "  device total     %12s at the backward's peak (its gradients not made yet) or the "
                                    "optimizer step's\n",
              format_bytes(e.device_bytes()).c_str());
  if (config.memory.activation_policy == "auto" && config.memory.swap)
    out += line("memory.activation_policy = auto with memory.swap = true: each block's choice is made with the swap "
                "plan, both within memory.device_budget_gb = %g GiB, once the run measures its blocks at start-up\n",
                config.memory.device_budget_gb);
  else if (config.memory.activation_policy == "auto")
    for (const ActivationShare& share : activation_shares(config, make_layout(config, dims)))
      out += line("memory.activation_policy = auto: memory.device_budget_gb = %g leaves %s for the blocks' activations%s "
                  "(the activations above keep every block's); the smallest policy needs %s; the run measures its "
                  "blocks at start-up and prints each block's choice\n",
                  config.memory.device_budget_gb, format_bytes(share.budget_bytes).c_str(),
                  share.pipeline_rank < 0 ? "" : line(" on pipeline rank %lld", static_cast<long long>(share.pipeline_rank)).c_str(),
                  format_bytes(smallest_activation_bytes(config, dims, share)).c_str());
  if (config.memory.swap)
    out += line("memory.swap = true: the figures above are what the model would hold resident; swapped, the device "
                "holds at most memory.device_budget_gb = %g GiB and the state lives in host memory (`tessera "
                "swap-plan` measures the blocks and prints the plan's device peak and host memory)\n",
                config.memory.device_budget_gb);
  return out;
}

void check_memory_fits(const Config& config, const MemoryEstimate& e, int64_t ranks_on_host,
                       double host_available_bytes, double device_capacity_bytes) {
  const std::pair<double, const char*> terms[] = {
      {e.parameter_bytes + e.gradient_bytes + (e.optimizer_on_host ? 0 : e.optimizer_bytes),
       "parameters, gradients and optimizer state (model.n_layer, model.n_embd, model.vocab_size, model.mlp_ratio, "
       "model.moe_experts; parallel.zero_stage and parallel.tp divide them, parallel.offload moves the optimizer state "
       "to the host)"},
      {e.activation_bytes_per_micro_batch,
       "activations (train.batch_size, train.seq_len, model.n_embd, model.n_layer; memory.activation_checkpointing "
       "and smaller micro-batches with train.grad_accum reduce them)"}};
  const auto& largest = terms[0].first >= terms[1].first ? terms[0] : terms[1];
  const std::string advice = ", the largest term is " + format_bytes(largest.first) + " of " + largest.second +
                             " (`tessera inspect` shows the estimate)";
  if (device_capacity_bytes > 0) {
    if (e.device_lower_bound_bytes() > device_capacity_bytes)
      fail("this run needs at least ", format_bytes(e.device_lower_bound_bytes()), " of GPU memory per rank, but the GPU ("
           "train.device = ", config.train.device, ") has ", format_bytes(device_capacity_bytes), advice);
    const double offloaded = e.optimizer_on_host ? e.optimizer_bytes * static_cast<double>(ranks_on_host) : 0;
    if (host_available_bytes > 0 && offloaded > host_available_bytes)
      fail("the offloaded optimizer state needs ", format_bytes(offloaded), " of host memory (",
           format_bytes(e.optimizer_bytes), " x ", ranks_on_host, " ranks on this host), but the host has ",
           format_bytes(host_available_bytes), " available (parallel.offload, parallel.zero_stage)");
    return;
  }
  if (config.train.device != "cpu" || host_available_bytes <= 0) return;
  const double per_rank = e.device_lower_bound_bytes() + (e.optimizer_on_host ? e.optimizer_bytes : 0);
  const double total = per_rank * static_cast<double>(ranks_on_host);
  if (total <= host_available_bytes) return;
  fail("this run needs at least ", format_bytes(per_rank), " per rank", ranks_on_host > 1 ? " x " : "",
       ranks_on_host > 1 ? std::to_string(ranks_on_host) + " ranks on this host = " + format_bytes(total) : "",
       ", but the host has ", format_bytes(host_available_bytes), " available;", advice.substr(1));
}

double host_memory_available() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  double kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return 0;
}

}  // namespace tessera
