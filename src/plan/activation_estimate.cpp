// What one block saves for its backward (activation_estimate.h).
#include "plan/activation_estimate.h"

#include "memory/activation_codec.h"
#include "precision/precision_options.h"

#include <algorithm>

namespace tessera {

double compute_element_bytes(const Config& config) {
  return static_cast<double>(
      c10::elementSize(autocast_dtype(config.precision).value_or(parameter_dtype(config.precision))));
}

double parameter_element_bytes(const Config& config) {
  return static_cast<double>(c10::elementSize(parameter_dtype(config.precision)));
}

ActivationCodec applied_activation_codec(const Config& config) {
  if (config.memory.activation_compression == "adaptive") return ActivationCodec::int8;
  return config.memory.activation_policy == "auto" ? ActivationCodec::none
                                                    : parse_activation_codec(config.memory.activation_compression);
}

std::vector<ActivationCodec> encoding_codecs(const Config& config) {
  std::vector<ActivationCodec> out;
  auto add = [&](ActivationCodec codec) {
    if (codec != ActivationCodec::none && codec != ActivationCodec::lossless &&
        std::find(out.begin(), out.end(), codec) == out.end())
      out.push_back(codec);
  };
  for (ActivationCodec codec : parse_activation_codecs(config.memory.activation_compression)) add(codec);
  if (const auto core = parse_attention_codec(config.memory.attention_compression)) add(*core);
  return out;
}

double activation_element_bytes(const Config& config) {
  if (config.memory.activation_compression == "adaptive")
    return std::min(config.memory.activation_bits / 8, compute_element_bytes(config));
  return activation_codec_bytes_per_element(applied_activation_codec(config), compute_element_bytes(config));
}

// Whether a block keeps k and v expanded to every query head: the sequence-parallel kernels (ring,
// Ulysses) take them expanded; the CPU's scaled-dot-product attention keeps them as they are
// (measured: ActivationEstimate.EachBlockKindSavesWhatTheEstimateCounts, tiny_llama); a GPU's
// kernels counted as expanding (not measured).
bool keeps_expanded_kv(const Config& config, const ParallelDims& dims) {
  const ModelOptions& m = config.model;
  return m.kv_heads() < m.n_head && (dims.sp() > 1 || config.train.device != "cpu");
}

// Whether the block's softmax attention runs the CPU's math path of scaled-dot-product attention
// and keeps what it saves: dropout on the CPU (ATen's fused CPU kernel has none), the block's own
// core (no sequence-parallel kernel: those refuse dropout), not recomputed (measured:
// ActivationEstimate.TheCpuAttentionWithDropoutSavesWhatTheEstimateCounts).
bool cpu_attention_math_path(const Config& config, const ParallelDims& dims) {
  const ModelOptions& m = config.model;
  return m.dropout > 0 && config.train.device == "cpu" && m.arch != "linear" && dims.sp() == 1 &&
         config.memory.activation_checkpointing == "none";
}

double block_statistics_bytes_per_token(const Config& config, const ParallelDims& dims) {
  const ModelOptions& m = config.model;
  const double norms = 4 * 2 * (m.rms_norm() ? 1 : 2);  // float32: LayerNorm's mean and rstd, RMSNorm's rstd
  const bool softmax_core = m.arch != "linear" && config.memory.activation_checkpointing != "selective";
  // The fused core's log-sum-exp, a float32 a head; the math path's float32 dropout mask instead,
  // a row of T a head.
  const double core = cpu_attention_math_path(config, dims) ? 4 * static_cast<double>(m.n_head * config.train.seq_len)
                                                            : 4 * static_cast<double>(m.n_head);
  return norms + (softmax_core ? core / static_cast<double>(dims.tp()) : 0);
}

double block_statistics_bytes(const Config& config, const ParallelDims& dims) {
  if (config.memory.activation_checkpointing == "full") return 0;
  return block_statistics_bytes_per_token(config, dims) *
         static_cast<double>(config.train.batch_size * (config.train.seq_len / dims.sp()));
}

bool keeps_storages_whole(ActivationCodec codec) {
  return codec == ActivationCodec::none || codec == ActivationCodec::lossless;
}

AttentionCoreElements attention_core_elements_per_token(const Config& config, const ParallelDims& dims,
                                                        ActivationCodec codec) {
  const ModelOptions& m = config.model;
  if (config.memory.activation_checkpointing != "none") return {};
  const double h = static_cast<double>(m.n_embd), t = static_cast<double>(dims.tp());
  const double heads = static_cast<double>(m.n_head);
  const double hq = heads * static_cast<double>(m.head_width());
  const double kv = static_cast<double>(std::max(m.kv_heads(), dims.tp()) * m.head_width());
  AttentionCoreElements core;
  if (m.arch == "linear") {
    // All of block_activation_bytes_per_token's lightning terms but the SiLU inputs (2h, before
    // the core), the normalised output and the gate (2h, after it) and their product (h).
    const double c = static_cast<double>(std::min(config.train.seq_len, m.linear_chunk));
    const double d = static_cast<double>(m.head_width());
    core.compute = 6 * h + heads * c + heads * d * d / c;
  } else if (cpu_attention_math_path(config, dims)) {
    // The math path's float32 tensors; the output projection keeps a copy of the output, outside.
    const double k = m.kv_heads() < m.n_head ? hq : kv;
    core.float32 = hq + 2 * k + 2 * heads * static_cast<double>(config.train.seq_len);
  } else {
    // q, k, v and the output (which the output projection's input shares), as the block's term
    // counts them under `codec`.
    core.compute = hq + 2 * kv + hq + (m.rotary() && keeps_storages_whole(codec) ? hq + kv : 0) +
                   (keeps_expanded_kv(config, dims) ? 2 * hq : 0);
  }
  core.compute /= t;
  core.float32 /= t;
  return core;
}

double block_activation_bytes_per_token(const Config& config, const ParallelDims& dims, int64_t layer,
                                        double element_bytes) {
  const ModelOptions& m = config.model;
  const ParallelOptions& p = config.parallel;
  const std::string& checkpointing = config.memory.activation_checkpointing;
  const double h = static_cast<double>(m.n_embd), t = static_cast<double>(dims.tp());
  if (checkpointing == "full") return h * element_bytes;

  const double heads = static_cast<double>(m.n_head);
  const double hq = heads * static_cast<double>(m.head_width());
  // Key/value heads as if split over tp: with fewer of them than tp ranks each rank holds one.
  const double kv = static_cast<double>(std::max(m.kv_heads(), dims.tp()) * m.head_width());
  // Split over tp: the attention's and the feed-forward's; replicated: the norms' (split too under
  // Megatron-SP).
  double split = 0, replicated = 4 * h;
  double math_core = 0;  // bytes: the CPU math path's float32 tensors (split over tp)
  // Under bf16 autocast on the CPU the residual stream stays float32 (the branches' bf16 outputs add
  // into it), so the norms' inputs are kept at 4 bytes (measured: tessera bench's
  // saved_activation_bytes, tiny_gpt at bf16, +4 MiB on 32; the GPU's fused norm not measured).
  const bool float_residual = config.precision.dtype == "bf16" && config.train.device == "cpu";
  if (float_residual) replicated -= 2 * h;
  if (m.arch == "linear") {
    // Lightning attention (model/linear_attention.cpp): the SiLU inputs of q and k (2h), q, k and v
    // (3h), each chunk's decayed scores (a c), the decayed q and k (2h), the state entering each
    // chunk (a d^2 / c), the output, its normalised copy, its sigmoid gate and their product (4h).
    const double c = static_cast<double>(std::min(config.train.seq_len, m.linear_chunk));
    const double d = static_cast<double>(m.head_width());
    split += 11 * h + heads * c + heads * d * d / c;
  } else if (cpu_attention_math_path(config, dims)) {
    // The CPU's math path (dropout): the output as the output projection keeps it; a scaled copy of
    // q, k transposed and v, each expanded to every query head under grouped-query attention and
    // in float32 (it computes a bf16 input in float32), the probabilities and the dropped
    // probabilities (float32, a row of T a head each; ATen's float mask is a statistic above).
    // Not the projection's q and k nor rotary's outputs: their copies are what it keeps.
    split += hq;
    const double k = m.kv_heads() < m.n_head ? hq : kv;
    const double rows = heads * static_cast<double>(config.train.seq_len);
    math_core = (hq + 2 * k + 2 * rows) * activation_codec_bytes_per_element(applied_activation_codec(config), 4);
  } else {
    split += hq + 2 * kv + hq;  // q, k, v and the output
    // Inside the core, which selective checkpointing recomputes: the rotated q and k, k and v
    // expanded to every head. With rotary positions the kernel keeps the rotated q and k in place
    // of the projection's; under a codec that keeps tensors whole (none, lossless) v keeps the
    // projection's whole output (q, k and v) beside them.
    const bool kept = checkpointing != "selective";
    if (m.rotary() && kept && keeps_storages_whole(applied_activation_codec(config))) split += hq + kv;
    if (keeps_expanded_kv(config, dims) && kept) split += 2 * hq;
  }
  // GELU: its input and output; SwiGLU (model/swiglu.h): the joined up and gate, and
  // the product (the down projection's input).
  auto mlp = [](double width, bool gated) { return (gated ? 3 : 2) * width; };
  if (m.is_moe_block(layer)) {
    const double f = static_cast<double>(m.expert_hidden());
    const double slots = m.expert_slots();
    split += slots * (2 * h + mlp(f, m.swiglu_experts())) + 2 * static_cast<double>(m.moe_experts) +
             static_cast<double>(m.moe_shared_experts) * (2 * h + mlp(f, m.swiglu_experts())) +
             (m.moe_shared_gate ? h + 1 : 0);  // the gate's scale and the shared output it scales
  } else {
    split += mlp(static_cast<double>(m.hidden()), m.swiglu());
  }
  // Bool masks (model/dropout.h on the CPU, ATen's fused dropout on CUDA): bytes, replicated; every
  // codec packs them 8 to a byte.
  const double mask_bytes = applied_activation_codec(config) == ActivationCodec::none ? 1.0 : 1.0 / 8;
  const double masks = m.dropout > 0 ? 2 * h * mask_bytes : 0;
  // Megatron-SP splits the norms' inputs and outputs over the sequence: the column-parallel
  // products keep their input as it was before the all-gather (sequence_gathered_linear), but for
  // lightning attention's four projections, which keep the gathered input: h whole.
  const double gathered = p.megatron_sp && m.arch == "linear" ? h - h / t : 0;
  const double rest = p.megatron_sp ? (replicated + split) / t + gathered : replicated + split / t;
  // float32 elements as the activation codec keeps them (lossless: 4 bytes; bf16: 2; int8, fp8: 1.125)
  const double residual_bytes = activation_codec_bytes_per_element(applied_activation_codec(config), 4);
  const double residual_inputs = float_residual ? 2 * h * residual_bytes / (p.megatron_sp ? t : 1) : 0;
  // The attention core's own codec (memory.attention_compression) in place of the block's.
  double core_codec = 0;
  if (const auto own = parse_attention_codec(config.memory.attention_compression)) {
    const ActivationCodec block = applied_activation_codec(config), core = *own;
    const AttentionCoreElements as_block = attention_core_elements_per_token(config, dims, block);
    const AttentionCoreElements as_core = attention_core_elements_per_token(config, dims, core);
    core_codec = as_core.compute * activation_codec_bytes_per_element(core, static_cast<int64_t>(compute_element_bytes(config))) -
                 as_block.compute * element_bytes +
                 (as_core.float32 * activation_codec_bytes_per_element(core, 4) - as_block.float32 * residual_bytes);
  }
  return rest * element_bytes + math_core / t + (p.megatron_sp ? masks / t : masks) +
         block_statistics_bytes_per_token(config, dims) + residual_inputs + core_codec;
}

double block_activation_bytes(const Config& config, const ParallelDims& dims, int64_t layer) {
  const double tokens = static_cast<double>(config.train.batch_size * (config.train.seq_len / dims.sp()));
  return block_activation_bytes_per_token(config, dims, layer, activation_element_bytes(config)) * tokens;
}

double recomputed_block_bytes(const Config& config, const ParallelDims& dims, int64_t layer) {
  Config whole = config;
  whole.memory.activation_checkpointing = "none";
  return block_activation_bytes(whole, dims, layer);
}

AwaitingW awaiting_w_bytes_per_token(const Config& config, const ParallelDims& dims, int64_t layer) {
  const ModelOptions& m = config.model;
  const double h = static_cast<double>(m.n_embd), t = static_cast<double>(dims.tp());
  const double hq = static_cast<double>(m.n_head * m.head_width());
  const double kv = static_cast<double>(std::max(m.kv_heads(), dims.tp()) * m.head_width());
  // Kept: the output gradients of the parameterised products and norms.
  double split = m.arch == "linear" ? 4 * h : hq + 2 * kv, whole = h;  // the attention's projections
  // Released: what the input path's other nodes saved (lightning attention's and the experts' not
  // counted, an over-estimate there).
  double released = 0;
  if (m.arch != "linear") {
    released += hq + 2 * kv;                           // the attention core's q, k and v
    if (m.rotary()) released += hq + kv;               // rotary's inputs
    if (keeps_expanded_kv(config, dims)) released += 2 * hq;  // k and v expanded to every head
  }
  if (m.is_moe_block(layer)) {
    const double f = static_cast<double>(m.expert_hidden());
    const double slots = m.expert_slots();
    split += slots * ((m.swiglu_experts() ? 2 : 1) * f + h);
  } else {
    const double f = static_cast<double>(m.hidden());
    split += (m.swiglu() ? 2 : 1) * f;
    released += (m.swiglu() ? 2 : 1) * f;  // GELU's input; SwiGLU's joined up and gate
    whole += h;
  }
  const double norms = config.parallel.megatron_sp ? 2 * h / t : 2 * h;
  const double e = compute_element_bytes(config);
  return {(split / t + whole + norms) * e, released / t * e};
}

PipelineHeld pipeline_held_bytes_per_token(const Config& config, const ParallelDims& dims) {
  const ModelOptions& m = config.model;
  const double h = static_cast<double>(m.n_embd), t = static_cast<double>(dims.tp());
  const double v = static_cast<double>(m.padded_vocab()) / t;
  const double e = compute_element_bytes(config);
  const bool msp = config.parallel.megatron_sp;
  PipelineHeld out;
  out.output = (msp ? h / t : h) * e;
  out.head = (msp ? h / t + h : 2 * h) * e + (dims.tp() > 1 ? 4 * v : v * e);
  return out;
}

BackwardWorkingSet backward_working_bytes(const Config& config, const ParallelDims& dims, bool has_head,
                                          bool has_blocks) {
  const ModelOptions& m = config.model;
  const ParallelOptions& p = config.parallel;
  const double tokens = static_cast<double>(config.train.batch_size * (config.train.seq_len / dims.sp()));
  const double h = static_cast<double>(m.n_embd), t = static_cast<double>(dims.tp());
  const double v = static_cast<double>(m.padded_vocab()) / t;
  const double element = compute_element_bytes(config), parameter = parameter_element_bytes(config);
  const double head_gradient = v * h * parameter;
  double head = 0, block = 0;
  if (has_head && dims.tp() > 1) {
    const double cast = element < 4 ? 4 * v : 0;  // the float32 copy of 16-bit logits (or their gradient's cast back)
    const double forward = tokens * (2 * h * element + v * element + cast + 2 * v * 4);
    const double backward = tokens * (2 * h * element + 2 * v * 4 + (element < 4 ? v * element : 0)) + head_gradient;
    head = std::max(forward, backward);
  } else if (has_head) {
    const double logits = element == 2 && config.train.device != "cpu" ? 2 * v * 2 : 3 * v * element;
    head = tokens * (2 * h * element + logits) + head_gradient;
  }
  if (has_blocks) {
    double hidden = 0, down = 0;  // per token, elements; the down-projection's weight, elements
    for (int64_t layer = 0; layer < m.n_layer; ++layer) {
      if (m.is_moe_block(layer)) {
        const double f = static_cast<double>(m.expert_hidden());
        const double slots = m.expert_slots();
        hidden = std::max(hidden, slots * f * (m.swiglu_experts() ? 2 : 1));
        down = std::max(down, f * h);
      } else {
        const double f = static_cast<double>(m.hidden()) / t;
        hidden = std::max(hidden, f * (m.swiglu() ? 2 : 1));
        down = std::max(down, f * h);
      }
    }
    // Under Megatron-SP the residual stream is split, but the column product's backward holds its
    // input gathered again and its input gradient before the reduce-scatter, both whole.
    const double residual = p.megatron_sp ? 2 * h / t + 2 * h : 2 * h;
    block = tokens * (residual + hidden) * element + down * parameter + (has_head ? head_gradient : 0);
  }
  return {head, block};
}

}  // namespace tessera
