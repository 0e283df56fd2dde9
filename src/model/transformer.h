// The language model: token embedding (+ learned positions where model.position is learned), n_layer
// blocks, a final norm and an output head, tied to the token embedding or (model.tie_embeddings =
// false) a matrix of its own, lm_head.
//
//   x = dropout(wte(idx) [+ wpe(o..o+T-1)])        [B, T, C], o = position offset (0 by default)
//   x = h[l](x) for l = 0..n_layer-1              (block.h; rotary positions inside attention)
//   logits = ln_f(x) W^T                           [B, T, V], W = wte, or lm_head untied
//   ce_loss = cross_entropy_mean(logits, targets)  mean over positions whose target is not -1 (model/cross_entropy.h)
//   loss = ce_loss + aux_loss                      aux_loss = Σ over MoE blocks (zero when dense)
//
// Parameter names (named_parameters()): wte.weight, wpe.weight (learned positions), h.{i}.ln_1.*,
// h.{i}.attn.*, h.{i}.ln_2.*, h.{i}.mlp.* or h.{i}.moe.*, ln_f.*, lm_head.weight (untied only). Every parameter
// is declared with its split and initialisation (parameter_specs(), model/parameter_spec.h); a
// parameter's initial value depends only on the model's seed and its name (model/init.h).
//
// Stages. A process may build only part of the model (ModelStage): one or more ranges of blocks
// (a pipeline rank's stages, several with virtual stages) under their global names h.{i}; the part
// holding block 0 also holds the embeddings, the one holding the last block ln_f, the head and the
// loss (with its own copy of wte when it does not hold the embedding: the tie is then kept by
// summing the two copies' gradients, which is the pipeline's job; an untied model's last stage holds
// lm_head and no wte). The pieces of forward run
// separately:
//   embed(idx) -> x;  run_blocks(x[, first, end]) -> x, aux;  head(x, targets) -> logits, losses
// and forward() is the three in a row (the whole model only).
//
// Deferred construction: built with TensorOptions on the meta device, parameters have shapes but
// no storage and no seed is drawn (counting and planning at any size, `tessera inspect`);
// materialize() then builds the described model on a device, equal to building there directly.
//
// The model is written for one device and never communicates; parallelism is applied from
// outside (parallel/parallelize.h) through these points, each with a stated owner:
// - block wrappers (add_block_wrapper): any number, composing: a wrapper receives the call of the
//   wrappers added before it (innermost: the block itself, with its activation checkpointing)
//   and decides when to make it (ZeRO-3 gathers around it); a pipeline stage is not a wrapper but
//   a model built with a ModelStage (its blocks and ends only), and the swap engine swaps the
//   storage under the parameters (parallel/swap_step.h);
// - end wrappers (add_end_wrapper): the same for the embedding and the head (ZeRO-3 brings the
//   ends' parameters in around each of them);
// - shard hooks (set_shard_hooks): the model's ends under tensor parallelism, one owner;
// - the layers' regions and kernels (model/sharded_region.h, attention.h, linear_attention.h,
//   moe.h), one owner each: a second installation is refused, never silently replaced.
// Under sequence parallelism a rank's input is one contiguous chunk of each sequence, starting at
// token o of it: set_position_offset(o) gives that chunk its positions (learned or rotary).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "model/block.h"
#include "model/linear.h"
#include "model/model_options.h"
#include "model/model_part.h"
#include "model/parameter_spec.h"

namespace tessera {

struct ModelOutput {
  at::Tensor logits;    // [B, T, V] ([B, T, V/tp] under tensor parallelism)
  at::Tensor loss;      // scalar: ce_loss + aux_loss; undefined without targets
  at::Tensor ce_loss;   // scalar; undefined without targets
  at::Tensor aux_loss;  // float32 scalar: sum of MoE load-balance and z-losses; zero for dense models
};

// The part of the model a process builds: block ranges [first, end) (ascending, disjoint; none:
// the whole model), with the embeddings when a range starts at block 0 and ln_f, the head and the
// loss when one ends at n_layer.
struct ModelStage {
  std::vector<std::pair<int64_t, int64_t>> chunks;
  ModelStage() = default;
  ModelStage(int64_t first, int64_t end) : chunks{{first, end}} {}
  bool whole() const { return chunks.empty(); }
  bool embedding() const;
  bool head(const ModelOptions& o) const;
  // The blocks held, ascending.
  std::vector<int64_t> layers(const ModelOptions& o) const;
  // "blocks 0-3", "blocks 0-1, 6-7".
  std::string describe(const ModelOptions& o) const;
};

// How a new model's parameters start: drawn from their declarations with a seed taken from torch's
// default CPU generator, or left uninitialised (no random number drawn) for a caller that fills
// every one of them next (a checkpoint's values, gathered shards).
enum class ModelInit { seeded, uninitialized };

class TransformerLMImpl : public torch::nn::Module {
 public:
  // `where`: the parameters' device (default: the CPU; float32); the meta device defers their
  // allocation and draws nothing (see materialize()).
  explicit TransformerLMImpl(const ModelOptions& opts, const ModelStage& stage = {},
                             const at::TensorOptions& where = {}, ModelInit init = ModelInit::seeded);

  // The whole model. idx: [B, T] int64 with offset + T <= block_size; targets: [B, T] int64
  // (-1 = ignored) or undefined.
  ModelOutput forward(const at::Tensor& idx, const at::Tensor& targets = {});

  // The pieces of forward (first stage, every stage, last stage):
  at::Tensor embed(const at::Tensor& idx);       // [B, T] -> [B, T', C] (T' = T / tp under Megatron-SP)
  BlockOutput run_blocks(const at::Tensor& x);   // this stage's blocks, through the wrappers; aux summed
  // Its blocks in [first, end); with `held`, each one without an offload of its own offloads
  // through it (a pipeline's held micro-batch: parallel/pipeline_step.h).
  BlockOutput run_blocks(const at::Tensor& x, int64_t first, int64_t end,
                         const std::shared_ptr<ActivationOffload>& held = nullptr);
  ModelOutput head(const at::Tensor& x, const at::Tensor& targets, const at::Tensor& aux_loss);

  // The position of idx[:, 0] in its sequence (>= 0): forward embeds positions offset .. offset+T-1.
  void set_position_offset(int64_t offset);

  // The routing state of the held MoE layers, which is not a parameter but is checkpointed: each
  // selection bias (model/moe.h) as "moe.h.<layer>.selection_bias", none while undefined.
  std::vector<std::pair<std::string, at::Tensor>> routing_state() const;
  // Takes the held layers' biases from `tensors` (entries for other layers are another stage's).
  void load_routing_state(const std::map<std::string, at::Tensor>& tensors);

  // Where every block's dropout masks come from (model/dropout.h).
  void set_dropout_streams(const DropoutStreams& streams);

  // "none" | "full" | "selective" (memory.activation_checkpointing); throws tessera::Error otherwise.
  void set_activation_checkpointing(const std::string& mode);
  // "none" | "lossless" | "bf16" | "fp8" | "int8" | "int4" (memory.activation_compression): how each block
  // keeps what autograd saves for its backward (memory/activation_codec.h).
  void set_activation_compression(const std::string& codec);
  // "same" | one of the codecs above (memory.attention_compression): the codec of what each block's
  // attention core saves, where "same" leaves it the block's (memory/saved_activations.h).
  void set_attention_compression(const std::string& codec);
  // memory.activation_compression = adaptive: every block encodes each tensor it saves by the codec
  // `codecs` chose for it (memory/adaptive_codecs.h), its slots named by its global index.
  void set_adaptive_activation_codecs(std::shared_ptr<AdaptiveCodecs> codecs);
  // Those codecs; null unless set.
  const std::shared_ptr<AdaptiveCodecs>& adaptive_activation_codecs() const { return adaptive_; }
  // The held blocks with a global index below `blocks` keep their saved activations in host memory
  // between forward and backward, through `offload` (memory.activation_offload; null or 0: none).
  void set_activation_offload(int64_t blocks, std::shared_ptr<ActivationOffload> offload);

  const ModelOptions& options() const { return opts_; }
  const ModelStage& stage() const { return stage_; }
  // The blocks this model holds, by global index, ascending.
  const std::vector<int64_t>& layers() const { return layers_; }
  bool has_embedding() const { return stage_.embedding(); }
  bool has_head() const { return stage_.head(opts_); }
  // Block `layer` by its global index (one of layers()).
  Block block(int64_t layer) const;

  // Every parameter's declaration, by its name in named_parameters().
  const ParameterSpecs& parameter_specs() const { return specs_; }
  bool is_meta() const;

  // A block wrapper makes the call of block `layer` on x through `inner` (the wrappers added
  // before it, then the block), doing its own work around it. Returns an id for removal.
  using BlockCall = std::function<BlockOutput(const at::Tensor& x)>;
  using BlockWrapper = std::function<BlockOutput(int64_t layer, const at::Tensor& x, const BlockCall& inner)>;
  int64_t add_block_wrapper(BlockWrapper wrapper);
  void remove_block_wrapper(int64_t id);
  // An end wrapper makes the call of the embedding or the head (`part`) through `inner` (the
  // wrappers added before it, then the part itself), doing its own work around it. Returns an id.
  using EndWrapper = std::function<void(const ModelPart& part, const std::function<void()>& inner)>;
  int64_t add_end_wrapper(EndWrapper wrapper);
  void remove_end_wrapper(int64_t id);

  // The model's ends when tensor parallelism shards them; an empty member keeps the single-device
  // computation (shown on the right):
  //   forward: x = dropout(embed(idx) + positions);  x = enter_blocks(x);  blocks;  logits(ln_f(x))
  // One owner: installing hooks over installed ones is refused (empty hooks clear them).
  struct ShardHooks {
    std::function<at::Tensor(const at::Tensor& idx)> embed;  // [B, T] -> [B, T, C]          wte(idx)
    std::function<at::Tensor(const at::Tensor& x)> enter_blocks;  // [B, T, C] -> [B, T', C] identity
    std::function<at::Tensor(const at::Tensor& h)> logits;  // [B, T', C] -> [B, T, V']      h wte^T
    // logits, targets [B, T] -> float32 mean over targets != -1    cross_entropy
    std::function<at::Tensor(const at::Tensor& logits, const at::Tensor& targets)> cross_entropy;
    explicit operator bool() const { return embed || enter_blocks || logits || cross_entropy; }
  };
  void set_shard_hooks(ShardHooks hooks);

  // The matrix the head's logits use: wte, or lm_head where untied (the last stage only).
  const at::Tensor& head_weight() const;

  Embedding wte{nullptr}, wpe{nullptr};  // wte: first stage, and last where tied; wpe: first stage, learned positions
  Embedding lm_head{nullptr};            // last stage, untied only ([V, C]; the head's, not a lookup)
  Norm ln_f{nullptr};                    // last stage

 private:
  ModelOptions opts_;
  ModelStage stage_;
  std::vector<int64_t> layers_;
  std::map<int64_t, Block> blocks_;  // this stage's, by global index (registered as h.{i})
  std::shared_ptr<AdaptiveCodecs> adaptive_;
  ParameterSpecs specs_;
  // Runs `part` (an end) through the end wrappers.
  void through_end_wrappers(const ModelPart& part, const std::function<void()>& run);

  std::vector<std::pair<int64_t, BlockWrapper>> wrappers_;  // innermost first
  std::vector<std::pair<int64_t, EndWrapper>> end_wrappers_;  // innermost first
  int64_t next_wrapper_id_ = 0;
  ShardHooks shard_hooks_;
  int64_t position_offset_ = 0;
};
TORCH_MODULE(TransformerLM);

// The model `meta` describes (its options and stage), built with its parameters on `where` and
// initialised: what building there directly at this point of the generator gives. (A parameter
// cannot change from the meta device to another in place, so this is a new model.) Refused when
// `meta` is not on the meta device.
TransformerLM materialize(const TransformerLMImpl& meta, const at::TensorOptions& where);

}  // namespace tessera
