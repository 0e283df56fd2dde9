// The language model: token embedding (+ learned positions for arch gpt), n_layer blocks, a final
// norm and an output head tied to the token embedding.
//
//   x = dropout(wte(idx) [+ wpe(o..o+T-1)])        [B, T, C], o = position offset (0 by default)
//   x = h[l](x) for l = 0..n_layer-1              (block.h)
//   logits = ln_f(x) wte^T                         [B, T, V]
//   ce_loss = cross_entropy(logits, targets)       mean over positions whose target is not -1
//   loss = ce_loss + aux_loss                      aux_loss = Σ over MoE blocks (zero when dense)
//
// Parameter names (named_parameters()): wte.weight, wpe.weight (gpt), h.{i}.ln_1.*, h.{i}.attn.*,
// h.{i}.ln_2.*, h.{i}.mlp.* or h.{i}.moe.*, ln_f.*. There is no lm_head parameter.
// Initialisation follows GPT-2: N(0, 0.02) weights, N(0, 0.02/sqrt(2*n_layer)) for residual output
// projections, zero biases, unit norm weights. The model is written for one device and never
// communicates; parallelism and checkpointing are applied from outside. Under sequence
// parallelism a rank's input is one contiguous chunk of each sequence, starting at token o of it:
// set_position_offset(o) gives that chunk its positions (arch gpt).
//
// Tensor parallelism (parallel/tensor/parallelize.h) shards the blocks through their regions
// (model/sharded_region.h) and the model's ends through set_shard_hooks: the token lookup, the
// split of the residual stream along the sequence (Megatron sequence parallelism), the head and the
// loss. Then logits are this rank's vocabulary columns [B, T, V/tp].
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/pimpl.h>

#include "model/block.h"
#include "model/model_options.h"

namespace tessera {

struct ModelOutput {
  at::Tensor logits;    // [B, T, V] ([B, T, V/tp] under tensor parallelism)
  at::Tensor loss;      // scalar: ce_loss + aux_loss; undefined without targets
  at::Tensor ce_loss;   // scalar; undefined without targets
  at::Tensor aux_loss;  // float32 scalar: sum of MoE load-balance and z-losses; zero for dense models
};

class TransformerLMImpl : public torch::nn::Module {
 public:
  explicit TransformerLMImpl(const ModelOptions& opts);

  // idx: [B, T] int64 with offset + T <= block_size; targets: [B, T] int64 (-1 = ignored) or undefined.
  ModelOutput forward(const at::Tensor& idx, const at::Tensor& targets = {});

  // The position of idx[:, 0] in its sequence (>= 0): forward embeds positions offset .. offset+T-1.
  void set_position_offset(int64_t offset);
  int64_t position_offset() const { return position_offset_; }

  // "none" | "full" | "selective" (memory.activation_checkpointing); throws tessera::Error otherwise.
  void set_activation_checkpointing(const std::string& mode);

  const ModelOptions& options() const { return opts_; }
  Block block(int64_t i) const { return blocks_.at(static_cast<size_t>(i)); }

  // How forward runs block i on x: block(i)(x) unless a runner is set. Parallelism applied from
  // outside wraps each block this way (ZeRO-3 gathers a block's parameters around its forward,
  // parallel/data/data_parallel.h); the runner calls block(i) itself. An empty runner restores
  // the default.
  using BlockRunner = std::function<BlockOutput(int64_t layer, const at::Tensor& x)>;
  void set_block_runner(BlockRunner runner) { block_runner_ = std::move(runner); }

  // The model's ends when tensor parallelism shards them; an empty member keeps the single-device
  // computation (shown on the right):
  //   forward: x = dropout(embed(idx) + positions);  x = enter_blocks(x);  blocks;  logits(ln_f(x))
  struct ShardHooks {
    std::function<at::Tensor(const at::Tensor& idx)> embed;  // [B, T] -> [B, T, C]          wte(idx)
    std::function<at::Tensor(const at::Tensor& x)> enter_blocks;  // [B, T, C] -> [B, T', C] identity
    std::function<at::Tensor(const at::Tensor& h)> logits;  // [B, T', C] -> [B, T, V']      h wte^T
    // logits, targets [B, T] -> float32 mean over targets != -1    cross_entropy
    std::function<at::Tensor(const at::Tensor& logits, const at::Tensor& targets)> cross_entropy;
  };
  void set_shard_hooks(ShardHooks hooks) { shard_hooks_ = std::move(hooks); }

  torch::nn::Embedding wte{nullptr}, wpe{nullptr};
  torch::nn::ModuleList h{nullptr};
  Norm ln_f{nullptr};

 private:
  ModelOptions opts_;
  std::vector<Block> blocks_;  // the entries of h, typed
  BlockRunner block_runner_;
  ShardHooks shard_hooks_;
  int64_t position_offset_ = 0;
};
TORCH_MODULE(TransformerLM);

}  // namespace tessera
