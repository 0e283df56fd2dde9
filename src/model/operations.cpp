// The operations of each block kind (operations.h).
#include "model/operations.h"

#include <algorithm>
#include <cmath>

namespace tessera {
namespace {

using Kind = Operation::Kind;

struct Builder {
  const OperationShape& shape;
  std::vector<Operation> ops;
  double e() const { return static_cast<double>(shape.element_bytes); }

  // [m, k] x [k, n], with a weight [k, n] or two activations.
  void matmul(std::string name, double m, double k, double n, bool weight, double backward_factor = 2,
              bool core = false) {
    Operation op{std::move(name), Kind::matmul, 2 * m * n * k, (m * k + k * n + m * n) * e(), 0, weight,
                 weight ? k * n : 0, backward_factor, core};
    op.rows = m, op.cols = n, op.depth = k;
    ops.push_back(std::move(op));
  }
  // `elements` read and written `passes` times in all (a read and a write: 2).
  void memory(std::string name, double elements, double passes, bool core = false) {
    ops.push_back({std::move(name), Kind::memory, 0, elements * passes * e(), 0, false, 0, 2, core});
  }
  void comm(std::string name, Kind kind, double elements) {
    ops.push_back({std::move(name), kind, 0, 0, elements, false, 0, 1, false});
  }
};

// The tokens a norm or residual runs on: a tensor-parallel rank's share of the sequence under
// Megatron-SP, else all of this rank's tokens (every tp rank repeats them).
double region_tokens(const OperationShape& s) {
  return s.tokens() / (s.megatron_sp ? static_cast<double>(s.tp) : 1.0);
}

void add_norm(Builder& b, const std::string& name, const ModelOptions& m) {
  b.memory(name, region_tokens(b.shape) * static_cast<double>(m.n_embd), 2);
}

void add_residual(Builder& b, const std::string& name, const ModelOptions& m, double dropout) {
  // x + dropout(branch): two reads and a write, and the mask's byte per element with dropout.
  const double n = region_tokens(b.shape) * static_cast<double>(m.n_embd);
  b.memory(name, n, dropout > 0 ? 3 + 1 / b.e() : 3);
}

// Megatron's f / g: one all-reduce of the block part's output over tp (a reduce-scatter and an
// all-gather of the same bytes under Megatron-SP).
void add_tp_reduce(Builder& b, const std::string& name, const ModelOptions& m) {
  if (b.shape.tp > 1) b.comm(name, Kind::tp_all_reduce, b.shape.tokens() * static_cast<double>(m.n_embd));
}

void add_attention(Builder& b, const ModelOptions& m) {
  const OperationShape& s = b.shape;
  const double T = s.tokens(), h = static_cast<double>(m.n_embd), d = static_cast<double>(m.head_width());
  const double tp = static_cast<double>(s.tp);
  // Key/value heads per rank: K / tp, or one where fewer than tp are replicated (tensor_parallel.h).
  const double q_heads = static_cast<double>(m.n_head) / tp,
               kv_heads = static_cast<double>(std::max(m.kv_heads(), s.tp)) / tp;
  add_norm(b, "attention.norm", m);
  b.matmul("attention.qkv", T, h, (q_heads + 2 * kv_heads) * d, true);
  if (m.qk_norm) b.memory("attention.qk_norm", T * (q_heads + kv_heads) * d, 2);
  if (m.rotary()) b.memory("attention.rotary", T * (q_heads + kv_heads) * d, 2);
  if (s.sp > 1) {
    // Ulysses: q, k, v to head shards and the output back; ring: keys and values around the ring;
    // LASP: the d x d state of each head around the ring (LASP-2: gathered at once).
    if (s.sp_method == "ulysses")
      b.comm("attention.sp_all_to_all", Kind::sp_all_to_all, T * (2 * q_heads + 2 * kv_heads) * d);
    else if (s.sp_method == "ring")
      b.comm("attention.sp_ring", Kind::sp_kv_ring, T * 2 * kv_heads * d);
    else
      b.comm("attention.sp_state", Kind::sp_ring, static_cast<double>(s.batch) * q_heads * d * d);
  }
  if (m.arch == "linear") {
    // Lightning attention: within each chunk c the causal half of q k^T and its product with v;
    // across chunks q S and the state update k^T v (d x d per head).
    const double c = static_cast<double>(std::min(s.seq_len, m.linear_chunk));
    b.matmul("attention.intra_chunk", T * q_heads, d, c, false, 2, true);  // 2 T c d per head
    b.matmul("attention.inter_chunk", T * q_heads, d, 2 * d, false, 2, true);
    b.memory("attention.decay", T * q_heads * d, 4, true);
    // The output gate: o * sigmoid(u_proj x) (model/linear_attention.h).
    b.matmul("attention.gate", T, h, q_heads * d, true);
    b.memory("attention.gating", T * q_heads * d, 3);
  } else {
    // Each of this rank's T queries (all heads it holds after Ulysses' exchange) against the
    // sequence's keys: q k^T and p v, 4 T S d FLOPs per head with S = seq_len; flash skips the
    // masked half. Under sp every rank holds T = tokens / sp queries of the full span.
    const double span = static_cast<double>(s.seq_len);
    const bool flash = s.attention == "flash";
    const double square = flash ? 0.5 : 1.0;
    Operation core{"attention.core", Kind::matmul, 4 * T * span * d * q_heads * square, 0, 0, false, 0,
                   flash ? 2.5 : 2, true};
    core.fused_attention = flash;
    // q, k, v read and the output written; unfused, also the scores written and the probabilities read.
    core.bytes = (T * (2 * q_heads + 2 * kv_heads) * d + (flash ? 0 : 2 * T * span * q_heads)) * b.e();
    b.ops.push_back(core);
    if (!flash) {
      // The scores written by q k^T, the fused scale-mask-softmax's read and write, dropout's read,
      // write and mask, and p v's read: the whole square per head.
      const double scores = T * span * q_heads;
      b.memory("attention.softmax", scores, 2, true);
      if (s.dropout > 0) b.memory("attention.dropout", scores, 2 + 1 / b.e(), true);
    }
  }
  b.matmul("attention.out", T, q_heads * d, h, true);
  add_tp_reduce(b, "attention.tp_all_reduce", m);
  add_residual(b, "attention.residual", m, s.dropout);
}

void add_mlp(Builder& b, const std::string& name, const ModelOptions& m, double tokens, double hidden, bool swiglu,
             double tp) {
  const double h = static_cast<double>(m.n_embd), H = hidden / tp;
  b.matmul(name + ".fc", tokens, h, swiglu ? 2 * H : H, true);
  b.memory(name + (swiglu ? ".swiglu" : ".gelu"), tokens * H, swiglu ? 3 : 2);
  b.matmul(name + ".proj", tokens, H, h, true);
}

// The chance that `draws` distinct experts of `pool` miss a given `owned` of them (hypergeometric).
double chance_missed(double pool, double owned, int64_t draws) {
  double p = 1;
  for (int64_t i = 0; i < draws; ++i) p *= std::max(0.0, (pool - owned - static_cast<double>(i)) / (pool - static_cast<double>(i)));
  return p;
}

// Hierarchical dispatch's expected rows per token that leave a rank (operations.h): to other
// nodes, and to the other ranks of a node.
struct HierarchicalRows {
  double between_nodes = 0, within_node = 0;
};
HierarchicalRows hierarchical_rows(const ModelOptions& m, const OperationShape& s) {
  const double E = static_cast<double>(m.moe_experts), M = static_cast<double>(s.ep_nodes);
  const double R = static_cast<double>(s.ep) / M;  // ep ranks per node
  const int64_t k = m.moe_top_k;
  const bool node_groups = m.moe_groups == s.ep_nodes && m.moe_topk_groups > 0;
  const double nodes = node_groups ? static_cast<double>(std::min<int64_t>(m.moe_topk_groups, k))
                                   : M * (1 - chance_missed(E, E / M, k));
  const int64_t per_node = std::max<int64_t>(1, std::llround(static_cast<double>(k) / nodes));
  const double ranks = R * (1 - chance_missed(E / M, E / static_cast<double>(s.ep), per_node));
  HierarchicalRows rows;
  rows.between_nodes = nodes * (M - 1) / M;
  rows.within_node = nodes * ranks * (R - 1) / R;
  return rows;
}

void add_feed_forward(Builder& b, const ModelOptions& m, int64_t layer) {
  const OperationShape& s = b.shape;
  const double T = s.tokens(), h = static_cast<double>(m.n_embd);
  add_norm(b, "mlp.norm", m);
  if (!m.is_moe_block(layer)) {
    add_mlp(b, "mlp", m, T, static_cast<double>(m.hidden()), m.swiglu(), static_cast<double>(s.tp));
    add_tp_reduce(b, "mlp.tp_all_reduce", m);
  } else {
    // Not tensor-parallel (parallel/tensor/tensor_parallel.h): every tp rank runs the layer whole.
    // Balanced routing: each rank's experts process top_k x its tokens' worth (capacity slots with
    // a capacity factor, computed whether filled or not); dropless, times the shape's expert_load.
    const double E = static_cast<double>(m.moe_experts);
    const double slots = T * m.expert_slots();
    b.matmul("moe.router", T, h, E, true);
    b.memory("moe.route", T * E, 4);
    const HierarchicalRows hops = s.ep > 1 && s.ep_hierarchical ? hierarchical_rows(m, s) : HierarchicalRows{};
    const double k = static_cast<double>(m.moe_top_k);
    if (s.ep > 1 && !s.ep_hierarchical) b.comm("moe.dispatch", Kind::ep_all_to_all, slots * h);
    // A token's row carries its k gates; its k int32 expert ids travel beside it.
    const double row = h + k + k * 4 / static_cast<double>(s.element_bytes);
    if (hops.between_nodes > 0) b.comm("moe.dispatch.between_nodes", Kind::ep_between_nodes, T * hops.between_nodes * row);
    if (hops.within_node > 0) b.comm("moe.dispatch.within_node", Kind::ep_within_node, T * hops.within_node * row);
    // Dropless under ep: the busiest rank's rows (the exchanges wait for it), an even share by default.
    const double load = s.ep > 1 && m.moe_capacity_factor <= 0 ? s.expert_load : 1;
    add_mlp(b, "moe.experts", m, slots * load, static_cast<double>(m.expert_hidden()), m.swiglu_experts(), 1);
    // The products above run one expert's weights per slot; the rank holds experts / ep of them.
    const double held = E / static_cast<double>(s.ep);
    for (const size_t product : {b.ops.size() - 3, b.ops.size() - 1}) {
      b.ops[product].parameters *= held;
      b.ops[product].expert = true;
    }
    if (s.ep > 1 && !s.ep_hierarchical) b.comm("moe.combine", Kind::ep_all_to_all, slots * h);
    if (hops.within_node > 0) b.comm("moe.combine.within_node", Kind::ep_within_node, T * hops.within_node * h);
    if (hops.between_nodes > 0) b.comm("moe.combine.between_nodes", Kind::ep_between_nodes, T * hops.between_nodes * h);
    b.memory("moe.combine_weights", slots * h, 2);
    if (m.moe_shared_experts > 0)
      add_mlp(b, "moe.shared", m, T, static_cast<double>(m.moe_shared_experts * m.expert_hidden()), m.swiglu_experts(), 1);
    if (m.moe_shared_gate) {
      b.matmul("moe.shared_gate", T, h, 1, true);
      b.memory("moe.shared_gate.scale", T * h, 3);
    }
  }
  add_residual(b, "mlp.residual", m, s.dropout);
}

}  // namespace

std::vector<Operation> block_operations(const ModelOptions& model, int64_t layer, const OperationShape& shape) {
  Builder b{shape, {}};
  add_attention(b, model);
  add_feed_forward(b, model, layer);
  return std::move(b.ops);
}

std::vector<Operation> embedding_operations(const ModelOptions& model, const OperationShape& shape) {
  Builder b{shape, {}};
  const double n = shape.tokens() * static_cast<double>(model.n_embd);
  b.memory("embedding.lookup", n, model.learned_positions() ? 4 : 2);
  b.ops.back().parameters = static_cast<double>(model.n_embd) *
                            (static_cast<double>(model.padded_vocab()) / static_cast<double>(shape.tp) +
                             (model.learned_positions() ? static_cast<double>(model.block_size) : 0));
  return std::move(b.ops);
}

std::vector<Operation> head_operations(const ModelOptions& model, const OperationShape& shape) {
  Builder b{shape, {}};
  const double T = shape.tokens(), V = static_cast<double>(model.padded_vocab()) / static_cast<double>(shape.tp);
  add_norm(b, "head.norm", model);
  b.matmul("head.logits", T, static_cast<double>(model.n_embd), V, true);
  if (model.tie_embeddings) b.ops.back().parameters = 0;  // the embedding's (a pipeline's last stage holds a copy)
  // The loss reads the logits for the maximum, the sum and the target, and writes their gradient.
  b.memory("head.cross_entropy", T * V, 3);
  return std::move(b.ops);
}

}  // namespace tessera
