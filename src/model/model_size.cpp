// Parameter and FLOP counts from a model on the meta device (model_size.h).
#include "model/model_size.h"

#include <algorithm>

#include "model/transformer.h"

namespace tessera {
namespace {

// The stored and the per-token parameter counts of the model's own modules, built on the meta
// device (no allocation): per token, positions are a lookup and an MoE layer runs top_k of its
// experts (their stacked weights hold E experts' worth each).
struct Counts {
  int64_t stored = 0, active = 0;
};

Counts count(const ModelOptions& o) {
  TransformerLM meta(o, ModelStage{}, at::TensorOptions().device(at::kMeta));
  Counts n;
  for (const auto& item : meta->named_parameters()) {
    const int64_t numel = item.value().numel();
    n.stored += numel;
    // Lookups, not matmuls: positions, and the token embedding where the head has its own matrix.
    if (item.key() == "wpe.weight" || (item.key() == "wte.weight" && !o.tie_embeddings)) continue;
    const bool expert = meta->parameter_specs().at(item.key()).split == Split::expert;
    n.active += expert ? numel / o.moe_experts * o.moe_top_k : numel;
  }
  return n;
}

}  // namespace

int64_t parameter_count(const ModelOptions& opts) { return count(opts).stored; }

double flops_per_token(const ModelOptions& opts, int64_t seq_len) {
  const double n_active = static_cast<double>(count(opts).active);
  const double L = static_cast<double>(opts.n_layer), C = static_cast<double>(opts.n_embd);
  if (opts.arch == "linear") {
    const double c = static_cast<double>(std::min(seq_len, opts.linear_chunk));
    return 6 * n_active + 6 * L * C * c + 12 * L * C * static_cast<double>(opts.head_width());
  }
  // Attention scores and their product with v: 2 T (q k and p v) x 2 (multiply-add) x 3 (forward,
  // backward) per head width, over every query head's width H d (C for GPT-2).
  const double width = static_cast<double>(opts.n_head * opts.head_width());
  return 6 * n_active + 6 * L * width * static_cast<double>(seq_len);
}

}  // namespace tessera
