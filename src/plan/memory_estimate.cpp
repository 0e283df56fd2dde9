// Per-rank memory of a configured run, from a meta-device model (memory_estimate.h).
#include "plan/memory_estimate.h"

#include <algorithm>

#include "model/transformer.h"

namespace tessera {

double MemoryEstimate::device_bytes() const {
  return parameter_bytes + gradient_bytes + (optimizer_on_host ? 0 : optimizer_bytes) + activation_bytes_per_micro_batch;
}

MemoryEstimate estimate_memory(const Config& config, const ParallelDims& dims) {
  const ModelOptions& m = config.model;
  const ParallelOptions& p = config.parallel;
  const TransformerLM meta(m, ModelStage{}, at::TensorOptions().device(at::kMeta));
  MemoryEstimate e;
  const bool fp16 = config.precision.dtype == "fp16";
  const double param_bytes = fp16 ? 2 : 4;
  double optimizer_elements_bytes = 0;
  for (const auto& item : meta->named_parameters()) {
    const at::Tensor& t = item.value();
    const Split split = meta->parameter_specs().at(item.key()).split;
    const double share = split == Split::replicated ? 1.0
                         : split == Split::expert   ? 1.0 / static_cast<double>(dims.ep())
                                                    : 1.0 / static_cast<double>(dims.tp());
    const double local = static_cast<double>(t.numel()) * share;
    e.parameters_total += t.numel();
    const std::string& name = item.key();
    e.parameters_by_component[name.rfind("h.", 0) == 0 ? "blocks" : name.rfind("ln_f", 0) == 0 ? "final norm"
                                                                                               : "embedding"] +=
        t.numel();
    e.parameters_rank += static_cast<int64_t>(local);
    double state = 8 * local;  // AdamW: exp_avg, exp_avg_sq
    if (config.optim.name == "adafactor") {
      const bool factored = t.dim() >= 2;
      const double rows = factored ? static_cast<double>(t.numel() / t.size(-1)) : 0;
      const double cols = factored ? static_cast<double>(t.numel() / t.size(-2)) : 0;
      state = (factored ? 4 * (rows + cols) * share : 4 * local) + (config.optim.adafactor_beta1 > 0 ? 4 * local : 0);
    }
    if (fp16) state += 4 * local;  // fp32 master
    optimizer_elements_bytes += state;
  }
  const double N = static_cast<double>(dims.dp());
  const double P = static_cast<double>(e.parameters_rank);
  e.parameter_bytes = P * param_bytes / (p.zero_stage >= 3 ? N : 1);
  e.gradient_bytes = P * param_bytes / (p.zero_stage >= 2 ? N : 1);
  e.optimizer_bytes = optimizer_elements_bytes / (p.zero_stage >= 1 ? N : 1);
  e.optimizer_on_host = p.offload;

  const double h = static_cast<double>(m.n_embd), a = static_cast<double>(m.n_head);
  const double t = static_cast<double>(dims.tp());
  const int64_t tokens = config.train.seq_len / dims.sp();
  const double s = static_cast<double>(m.arch == "linear" ? std::min(config.train.seq_len, m.linear_chunk)
                                                          : config.train.seq_len);
  const std::string& mode = config.memory.activation_checkpointing;
  double per_layer;  // bytes per token at 2-byte activations
  if (mode == "full") {
    per_layer = 2 * h;
  } else {
    const double scores = mode == "selective" ? 0 : 5 * a * s / t;
    per_layer = (p.megatron_sp ? 34 * h / t : h * (10 + 24 / t)) + scores;
  }
  const bool half = fp16 || config.precision.dtype == "bf16";
  e.activation_bytes_per_token = per_layer * (half ? 1 : 2) * static_cast<double>(m.n_layer);
  e.activation_bytes_per_micro_batch =
      e.activation_bytes_per_token * static_cast<double>(config.train.batch_size * tokens);
  return e;
}

}  // namespace tessera
