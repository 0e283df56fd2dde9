// One pre-norm transformer block:
//   x = x + dropout(attn(ln_1(x)))
//   x = x + dropout(ffn(ln_2(x)))         ffn = mlp (dense) or moe
// Submodules: ln_1, attn, ln_2, and mlp or moe. arch gpt uses LayerNorm and softmax attention;
// arch linear uses RMSNorm and lightning attention (norm.h, attention.h, linear_attention.h).
//
// Activation checkpointing is applied from outside through set_checkpoint_mode: full recomputes
// the whole block in backward, selective only the attention core. Compression of what autograd
// saves (set_activation_codec) covers the whole forward, a fully checkpointed block's saved input
// included, but for the attention core's tensors when set_attention_core_codec gives them their own
// codec (memory/saved_activations.h); and so does its offload to host memory (set_activation_offload; memory/
// saved_activations.h, memory/activation_offload.h). With codecs chosen per saved tensor
// (set_adaptive_codecs; memory/adaptive_codecs.h) those replace both codecs.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <utility>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "memory/activation_checkpointing.h"
#include "memory/activation_codec.h"
#include "memory/activation_offload.h"
#include "memory/adaptive_codecs.h"
#include "model/attention.h"
#include "model/dropout.h"
#include "model/linear_attention.h"
#include "model/mlp.h"
#include "model/model_options.h"
#include "model/moe.h"
#include "model/norm.h"

namespace tessera {

struct BlockOutput {
  at::Tensor x;         // [B, T, C]
  at::Tensor aux_loss;  // float32 scalar: the MoE auxiliary losses, zero for a dense block
};

class BlockImpl : public torch::nn::Module {
 public:
  BlockImpl(const ModelOptions& opts, int64_t layer, const at::TensorOptions& where);
  // `held`: where the saved activations wait when the block has no offload of its own (a
  // pipeline's held micro-batch, memory.resident_micro_batches; null: on the device).
  BlockOutput forward(const at::Tensor& x, const std::shared_ptr<ActivationOffload>& held = nullptr);
  void set_checkpoint_mode(CheckpointMode mode);
  void set_activation_codec(ActivationCodec codec) { codec_ = codec; }
  // The attention core's codec (memory.attention_compression; unset: the block's).
  void set_attention_core_codec(std::optional<ActivationCodec> codec) { core_codec_ = codec; }
  // The codecs chosen per saved tensor (memory.activation_compression = adaptive), this block's
  // slots under `block` (its layer); null: the codecs above.
  void set_adaptive_codecs(std::shared_ptr<AdaptiveCodecs> codecs, int64_t block) {
    adaptive_ = std::move(codecs);
    adaptive_block_ = block;
  }
  // Where the block's saved activations wait for its backward (null: on the device).
  void set_activation_offload(std::shared_ptr<ActivationOffload> offload) { offload_ = std::move(offload); }
  // Where the block's dropout masks come from (model/dropout.h; default: the shared stream).
  void set_dropout_streams(const DropoutStreams& streams);
  ParameterSpecs parameter_specs() const;  // its submodules', under their names

  Norm ln_1{nullptr}, ln_2{nullptr};
  CausalSelfAttention softmax_attn{nullptr};  // registered as "attn" (arch gpt)
  LinearAttention linear_attn{nullptr};       // registered as "attn" (arch linear)
  MLP mlp{nullptr};                           // dense blocks
  MoE moe{nullptr};                           // MoE blocks

 private:
  BlockOutput run(const at::Tensor& x);

  double dropout_;
  DropoutStreams streams_;
  CheckpointMode mode_ = CheckpointMode::none;
  ActivationCodec codec_ = ActivationCodec::none;
  std::optional<ActivationCodec> core_codec_;
  std::shared_ptr<ActivationOffload> offload_;
  std::shared_ptr<AdaptiveCodecs> adaptive_;
  int64_t adaptive_block_ = -1;
};
TORCH_MODULE(Block);

}  // namespace tessera
