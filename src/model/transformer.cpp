// TransformerLM: embeddings, blocks, tied head, losses (transformer.h).
#include "model/transformer.h"

#include <torch/torch.h>

#include "model/dropout.h"

#include "core/error.h"
#include "model/norm.h"

namespace tessera {

TransformerLMImpl::TransformerLMImpl(const ModelOptions& opts) : opts_(opts) {
  opts_.check("model options");
  const int64_t C = opts.n_embd;
  wte = register_module("wte", torch::nn::Embedding(opts.vocab_size, C));
  init_normal(wte->weight, 0.02);
  if (opts.arch == "gpt") {
    wpe = register_module("wpe", torch::nn::Embedding(opts.block_size, C));
    init_normal(wpe->weight, 0.02);
  }
  h = register_module("h", torch::nn::ModuleList());
  for (int64_t l = 0; l < opts.n_layer; ++l) {
    blocks_.push_back(Block(opts, l));
    h->push_back(blocks_.back());
  }
  ln_f = register_module("ln_f", Norm(opts.arch == "linear" ? NormKind::rms : NormKind::layer, C, opts.bias));
}

void TransformerLMImpl::set_activation_checkpointing(const std::string& mode) {
  const CheckpointMode parsed = parse_checkpoint_mode(mode);
  for (auto& b : blocks_) b->set_checkpoint_mode(parsed);
}

void TransformerLMImpl::set_position_offset(int64_t offset) {
  require(offset >= 0, "internal: position offset ", offset, " is negative");
  position_offset_ = offset;
}

ModelOutput TransformerLMImpl::forward(const at::Tensor& idx, const at::Tensor& targets) {
  require(idx.dim() == 2, "model input must be [batch, time] token ids (got shape ", idx.sizes(), ")");
  const int64_t T = idx.size(1), first = position_offset_;
  if (first == 0)
    require(T <= opts_.block_size, "sequence length ", T, " exceeds model.block_size = ", opts_.block_size);
  else
    require(first + T <= opts_.block_size, "positions ", first, "..", first + T - 1, " (a chunk of ", T,
            " tokens at position offset ", first, ") exceed model.block_size = ", opts_.block_size);
  const ShardHooks& hooks = shard_hooks_;
  auto x = hooks.embed ? hooks.embed(idx) : wte(idx);
  if (wpe) x = x + wpe(torch::arange(first, first + T, idx.options()));
  x = dropout_if_active(x, opts_.dropout, is_training());
  if (hooks.enter_blocks) x = hooks.enter_blocks(x);
  ModelOutput out;
  out.aux_loss = torch::zeros({}, x.options().dtype(at::kFloat));
  for (size_t l = 0; l < blocks_.size(); ++l) {
    auto o = block_runner_ ? block_runner_(static_cast<int64_t>(l), x) : blocks_[l](x);
    x = o.x;
    out.aux_loss = out.aux_loss + o.aux_loss;
  }
  out.logits = hooks.logits ? hooks.logits(ln_f(x)) : at::linear(ln_f(x), wte->weight);
  if (targets.defined()) {
    require(targets.sizes() == idx.sizes(), "targets shape ", targets.sizes(), " differs from input shape ",
            idx.sizes());
    out.ce_loss = hooks.cross_entropy
                      ? hooks.cross_entropy(out.logits, targets)
                      : at::cross_entropy_loss(out.logits.reshape({-1, out.logits.size(-1)}).to(at::kFloat),
                                               targets.reshape(-1), {}, at::Reduction::Mean, /*ignore_index=*/-1);
    out.loss = out.ce_loss + out.aux_loss;
  }
  return out;
}

}  // namespace tessera
