// How each parameter of a model is laid out across model-parallel ranks and how it starts,
// declared by the module that owns it (Megatron's ModuleSpec, DTensor placements). Parallelism
// applied from outside reads these declarations; nothing is inferred from a parameter's name.
//
//   split        tensor parallelism (N = tp ranks, rank r)         expert parallelism
//   replicated   every rank holds the whole tensor                 whole
//   column       dim 0 in `parts` equal blocks, each cut in N;     whole
//                rank r holds chunk r of every block, in order
//                (c_attn: q, k, v; the GLU's c_fc: a, g). With
//                `heads` (whole attention heads a block holds)
//                fewer than N, dividing it: each block is cut in
//                `heads` chunks, each held by N / heads consecutive
//                ranks (grouped-query attention's key/value heads
//                replicated under tp); their gradients are summed
//                over the ranks holding the same chunk
//   row          dim 1 cut in N, rank r holds chunk r              whole
//   vocab        dim 0 (the vocabulary) cut in N                   whole
//   expert       whole (the MoE layer is not tensor-parallel)      dim 0 (experts) cut in ep
//
// Each parameter also declares which ranks average its gradient (its reduction group; the data
// replicas are the ranks that ran different data on the same parameters):
//   data          the dp ranks (x sp under sequence parallelism): every replica of the parameter
//   expert_data   the edp ranks (x sp): the dp / ep replicas that hold the same experts; the ep
//                 ranks of an edp group hold different experts, so the clipping norm sums over dp
// An expert-split parameter is reduced over expert_data and every other over data (checked with the
// declarations at construction). The tied token embedding of a model built as pipeline stages is
// also summed between the first and last stage (ParallelDims' "embedding" group); that sum is the
// pipeline's, not a declaration.
//
// Where a parameter lives in the model is declared too, so that pipeline stages, the swap engine's
// sub-models and the memory estimate never read it from a name: `block`, the global index of the
// block it belongs to, or -1 for the model's ends, which say which end (`end`: the embedding, wte
// and wpe, built with the first stage; the head, ln_f, with the last). The token embedding is
// `tied`: the head computes the logits with it, so a stage that holds the head but not the
// embedding holds a copy of it, whose gradient the pipeline sums with the first stage's (over
// ParallelDims' "embedding" group) and which the clipping norm and the checkpoints count once.
//
// Initialisation is declared beside the split (GPT-2's: N(0, 0.02) weights, N(0, 0.02/sqrt(2L))
// residual output projections, zero biases, unit norm weights) and drawn per parameter from a
// generator seeded by the model's seed and the parameter's global name (model/init.h), so a
// parameter starts equal however the model is built: whole, as a pipeline stage, or on the meta
// device and materialised later.
//
// A model's declarations cover every one of its named_parameters(): TransformerLMImpl checks that
// at construction, so a parameter added without a declaration is an error, never "replicated".
// (A declared bias that model.bias = false leaves out is dropped.)
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace tessera {

enum class Split { replicated, column, row, vocab, expert };
enum class ReductionGroup { data, expert_data };
enum class ModelEnd { none, embedding, head };

struct ParameterInit {
  enum class Kind { zeros, ones, normal };
  Kind kind = Kind::zeros;
  double std = 0;  // normal only
};

struct ParameterSpec {
  Split split = Split::replicated;
  int64_t parts = 1;  // column only: equal blocks of dim 0, each split separately
  ParameterInit init;
  ReductionGroup reduce = ReductionGroup::data;
  int64_t block = -1;             // the global block index; -1: one of the ends
  ModelEnd end = ModelEnd::none;  // which end, for block -1
  bool tied = false;              // the token embedding, which the head uses too
  // Replicated under tensor parallelism, but each rank applies it to its own heads only (Qwen 3's
  // q and k norms): a rank's gradient is its heads' part, summed over tp to the whole.
  bool per_head = false;
  int64_t heads = 0;  // column only: whole heads per block, replicated when fewer than tp (0: not heads)
};

// The distinct chunks `ranks` tensor-parallel ranks hold of a column-split tensor: one each, or,
// where its whole heads are fewer, one a head (each held by ranks / heads of them).
inline int64_t tensor_parallel_chunks(const ParameterSpec& spec, int64_t ranks) {
  return spec.heads > 0 && spec.heads < ranks ? spec.heads : ranks;
}

// Whether a tensor-parallel rank's gradient of the parameter is only its share, summed over tp once
// a step (parallel/tensor/gradient_shares.h; priced by plan/cost_model.cpp): under
// Megatron-SP every parameter tp leaves whole (replicated, or an expert's: an MoE layer runs whole
// on every tp rank) used after the sequence split, which sees this rank's tokens only (any but
// the embedding's: wpe is added to the whole sequence before it); and every per-head one, which
// sees this rank's heads only.
inline bool gradient_summed_over_tp(const ParameterSpec& spec, bool megatron_sp) {
  const bool whole = spec.split == Split::replicated || spec.split == Split::expert;
  return (megatron_sp && whole && spec.end != ModelEnd::embedding) || spec.per_head;
}

// Parameter name (as in named_parameters(), relative to the declaring module) -> its spec.
using ParameterSpecs = std::map<std::string, ParameterSpec>;

inline ParameterInit normal_init(double std) { return {ParameterInit::Kind::normal, std}; }
inline ParameterInit ones_init() { return {ParameterInit::Kind::ones, 0}; }

inline void add_specs(ParameterSpecs& out, const ParameterSpecs& more) { out.insert(more.begin(), more.end()); }
// Adds a submodule's declarations under `prefix` + ".".
inline void add_specs(ParameterSpecs& out, const std::string& prefix, const ParameterSpecs& inner) {
  for (const auto& [name, spec] : inner) out.emplace(prefix + "." + name, spec);
}

// A Linear's weight (normal, `std`) and bias (zeros): a column-parallel layer splits both along
// its outputs; a row-parallel layer splits the weight's inputs and keeps its bias whole (it is
// added once, after the ranks' partial products are summed).
inline ParameterSpecs column_linear(const std::string& name, double std, int64_t parts = 1, int64_t heads = 0) {
  ParameterSpecs specs = {{name + ".weight", {Split::column, parts, normal_init(std)}},
                          {name + ".bias", {Split::column, parts, {}}}};
  for (auto& [key, spec] : specs) spec.heads = heads;
  return specs;
}
inline ParameterSpecs row_linear(const std::string& name, double std) {
  return {{name + ".weight", {Split::row, 1, normal_init(std)}}, {name + ".bias", {Split::replicated, 1, {}}}};
}

}  // namespace tessera
