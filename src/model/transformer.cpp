// TransformerLM: stages, declarations, embeddings, blocks through their wrappers, tied head,
// losses (transformer.h).
#include "model/transformer.h"

#include <algorithm>

#include <torch/nn/module.h>
#include <torch/types.h>

#include "core/error.h"
#include "memory/saved_activations.h"
#include "model/cross_entropy.h"
#include "model/dropout.h"
#include "model/hook_slot.h"
#include "model/init.h"
#include "model/linear.h"
#include "model/norm.h"

namespace tessera {
namespace {

// Removes the wrapper with `id` from `wrappers` ((id, wrapper) pairs); refuses an unknown id.
template <class Wrapper>
void erase_wrapper(std::vector<std::pair<int64_t, Wrapper>>& wrappers, int64_t id, const char* kind) {
  for (auto it = wrappers.begin(); it != wrappers.end(); ++it)
    if (it->first == id) {
      wrappers.erase(it);
      return;
    }
  fail("internal: no ", kind, " wrapper ", id);
}

}  // namespace

bool ModelStage::embedding() const {
  return whole() || std::any_of(chunks.begin(), chunks.end(), [](const auto& c) { return c.first == 0; });
}

bool ModelStage::head(const ModelOptions& o) const {
  return whole() || std::any_of(chunks.begin(), chunks.end(), [&](const auto& c) { return c.second == o.n_layer; });
}

std::vector<int64_t> ModelStage::layers(const ModelOptions& o) const {
  std::vector<int64_t> out;
  if (whole())
    for (int64_t l = 0; l < o.n_layer; ++l) out.push_back(l);
  for (const auto& [first, end] : chunks)
    for (int64_t l = first; l < end; ++l) out.push_back(l);
  return out;
}

std::string ModelStage::describe(const ModelOptions& o) const {
  if (whole()) return "blocks 0-" + std::to_string(o.n_layer - 1);
  std::string out = "blocks ";
  for (size_t i = 0; i < chunks.size(); ++i)
    out += (i ? ", " : "") + std::to_string(chunks[i].first) + "-" + std::to_string(chunks[i].second - 1);
  return out;
}

TransformerLMImpl::TransformerLMImpl(const ModelOptions& opts, const ModelStage& stage, const at::TensorOptions& where,
                                     ModelInit init)
    : opts_(opts), stage_(stage) {
  opts_.check("model options");
  const int64_t C = opts.n_embd;
  int64_t previous_end = 0;
  for (const auto& [first, end] : stage.chunks) {
    require(first >= previous_end && first < end && end <= opts.n_layer, "internal: a model stage of ",
            stage.describe(opts), " for model.n_layer = ", opts.n_layer, " (ranges ascending, disjoint, not empty)");
    previous_end = end;
  }
  layers_ = stage.layers(opts);
  const at::TensorOptions options = where.dtype(at::kFloat);
  if (has_embedding() || (has_head() && opts.tie_embeddings)) {
    wte = register_module("wte", Embedding(opts.padded_vocab(), C, options));
    ParameterSpec spec{Split::vocab, 1, normal_init(0.02)};
    spec.end = ModelEnd::embedding;
    spec.tied = opts.tie_embeddings;
    specs_.emplace("wte.weight", spec);
  }
  if (has_head() && !opts.tie_embeddings) {
    lm_head = register_module("lm_head", Embedding(opts.padded_vocab(), C, options));
    ParameterSpec spec{Split::vocab, 1, normal_init(0.02)};
    spec.end = ModelEnd::head;
    specs_.emplace("lm_head.weight", spec);
  }
  if (has_embedding() && opts.learned_positions()) {
    wpe = register_module("wpe", Embedding(opts.block_size, C, options));
    ParameterSpec spec{Split::replicated, 1, normal_init(0.02)};
    spec.end = ModelEnd::embedding;
    specs_.emplace("wpe.weight", spec);
  }
  auto h = register_module("h", std::make_shared<torch::nn::Module>());
  for (int64_t l : layers_) {
    const std::string name = std::to_string(l);
    Block block = h->register_module(name, Block(opts, l, options));
    blocks_.emplace(l, block);
    ParameterSpecs inner = block->parameter_specs();
    for (auto& [n, spec] : inner) spec.block = l;
    add_specs(specs_, "h." + name, inner);
  }
  if (has_head()) {
    ln_f = register_module("ln_f", Norm(opts.rms_norm() ? NormKind::rms : NormKind::layer, C, opts.bias, options,
                                        opts.norm_eps));
    ParameterSpecs inner = ln_f->parameter_specs();
    for (auto& [n, spec] : inner) spec.end = ModelEnd::head;
    add_specs(specs_, "ln_f", inner);
  }
  // Keep exactly the declarations of parameters that exist; a parameter without one is an error.
  ParameterSpecs declared;
  for (const auto& item : named_parameters()) {
    const auto spec = specs_.find(item.key());
    require(spec != specs_.end(), "internal: parameter ", item.key(), " has no declaration (model/parameter_spec.h)");
    require((spec->second.split == Split::expert) == (spec->second.reduce == ReductionGroup::expert_data),
            "internal: parameter ", item.key(), " is declared ",
            spec->second.split == Split::expert ? "expert-split but not" : "not expert-split but",
            " reduced over the expert-data-parallel group (model/parameter_spec.h)");
    declared.insert(*spec);
  }
  specs_ = std::move(declared);
  if (!where.device().is_meta() && init == ModelInit::seeded) initialize_parameters(*this, specs_, draw_model_seed());
}

Block TransformerLMImpl::block(int64_t layer) const {
  const auto it = blocks_.find(layer);
  require(it != blocks_.end(), "internal: block ", layer, " is not in this model stage (", stage_.describe(opts_), ")");
  return it->second;
}

const at::Tensor& TransformerLMImpl::head_weight() const {
  require(has_head(), "internal: head_weight() on a model stage without the head (", stage_.describe(opts_), ")");
  return opts_.tie_embeddings ? wte->weight : lm_head->weight;
}

bool TransformerLMImpl::is_meta() const { return parameters().front().is_meta(); }

TransformerLM materialize(const TransformerLMImpl& meta, const at::TensorOptions& where) {
  require(meta.is_meta(), "internal: materialize() on a model that is already on ", meta.parameters().front().device());
  return TransformerLM(meta.options(), meta.stage(), where);
}

void TransformerLMImpl::set_activation_checkpointing(const std::string& mode) {
  const CheckpointMode parsed = parse_checkpoint_mode(mode);
  for (auto& [l, b] : blocks_) b->set_checkpoint_mode(parsed);
}

void TransformerLMImpl::set_activation_compression(const std::string& codec) {
  const ActivationCodec parsed = parse_activation_codec(codec);
  for (auto& [l, b] : blocks_) b->set_activation_codec(parsed);
}

void TransformerLMImpl::set_adaptive_activation_codecs(std::shared_ptr<AdaptiveCodecs> codecs) {
  adaptive_ = std::move(codecs);
  for (auto& [l, b] : blocks_) b->set_adaptive_codecs(adaptive_, l);
}

void TransformerLMImpl::set_attention_compression(const std::string& codec) {
  const std::optional<ActivationCodec> parsed = parse_attention_codec(codec);
  for (auto& [l, b] : blocks_) b->set_attention_core_codec(parsed);
}

void TransformerLMImpl::set_activation_offload(int64_t blocks, std::shared_ptr<ActivationOffload> offload) {
  for (auto& [l, b] : blocks_) b->set_activation_offload(l < blocks ? offload : nullptr);
}

std::vector<std::pair<std::string, at::Tensor>> TransformerLMImpl::routing_state() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (int64_t layer : layers())
    if (MoE moe = block(layer)->moe)
      if (moe->selection_bias().defined())
        out.emplace_back("moe.h." + std::to_string(layer) + ".selection_bias", moe->selection_bias().clone());
  return out;
}

void TransformerLMImpl::load_routing_state(const std::map<std::string, at::Tensor>& tensors) {
  for (int64_t layer : layers())
    if (MoE moe = block(layer)->moe) {
      const auto it = tensors.find("moe.h." + std::to_string(layer) + ".selection_bias");
      if (it != tensors.end()) moe->set_selection_bias(it->second);
    }
}

void TransformerLMImpl::set_position_offset(int64_t offset) {
  require(offset >= 0, "internal: position offset ", offset, " is negative");
  position_offset_ = offset;
  for (auto& [l, block] : blocks_)
    if (block->softmax_attn) block->softmax_attn->set_position_offset(offset);
}

int64_t TransformerLMImpl::add_block_wrapper(BlockWrapper wrapper) {
  wrappers_.emplace_back(next_wrapper_id_, std::move(wrapper));
  return next_wrapper_id_++;
}

void TransformerLMImpl::remove_block_wrapper(int64_t id) { erase_wrapper(wrappers_, id, "block"); }

void TransformerLMImpl::set_dropout_streams(const DropoutStreams& streams) {
  for (auto& [l, block] : blocks_) block->set_dropout_streams(streams);
}

int64_t TransformerLMImpl::add_end_wrapper(EndWrapper wrapper) {
  end_wrappers_.emplace_back(next_wrapper_id_, std::move(wrapper));
  return next_wrapper_id_++;
}

void TransformerLMImpl::remove_end_wrapper(int64_t id) { erase_wrapper(end_wrappers_, id, "end"); }

void TransformerLMImpl::through_end_wrappers(const ModelPart& part, const std::function<void()>& run) {
  std::function<void()> call = run;
  for (const auto& [id, wrapper] : end_wrappers_)
    call = [&part, w = wrapper, inner = std::move(call)] { w(part, inner); };
  call();
}

void TransformerLMImpl::set_shard_hooks(ShardHooks hooks) {
  install_once(shard_hooks_, std::move(hooks), "the model's shard hooks");
}

at::Tensor TransformerLMImpl::embed(const at::Tensor& idx) {
  require(has_embedding(), "internal: embed() on a model stage without the embedding (", stage_.describe(opts_), ")");
  require(idx.dim() == 2, "model input must be [batch, time] token ids (got shape ", idx.sizes(), ")");
  const int64_t T = idx.size(1), first = position_offset_;
  if (first == 0)
    require(T <= opts_.block_size, "sequence length ", T, " exceeds model.block_size = ", opts_.block_size);
  else
    require(first + T <= opts_.block_size, "positions ", first, "..", first + T - 1, " (a chunk of ", T,
            " tokens at position offset ", first, ") exceed model.block_size = ", opts_.block_size);
  const ShardHooks& hooks = shard_hooks_;
  at::Tensor x;
  through_end_wrappers(ModelPart::embedding(), [&] {
    x = hooks.embed ? hooks.embed(idx) : wte(idx);
    if (wpe) x = x + wpe(torch::arange(first, first + T, idx.options()));
  });
  x = dropout_if_active(x, opts_.dropout, is_training());
  return hooks.enter_blocks ? hooks.enter_blocks(x) : x;
}

BlockOutput TransformerLMImpl::run_blocks(const at::Tensor& x) { return run_blocks(x, 0, opts_.n_layer); }

BlockOutput TransformerLMImpl::run_blocks(const at::Tensor& x, int64_t first, int64_t end,
                                          const std::shared_ptr<ActivationOffload>& held) {
  BlockOutput out{x, torch::zeros({}, x.options().dtype(at::kFloat))};
  for (auto it = blocks_.lower_bound(first); it != blocks_.end() && it->first < end; ++it) {
    auto& [l, block] = *it;
    BlockCall call = [b = block, &held](const at::Tensor& in) mutable { return b->forward(in, held); };
    for (const auto& [id, wrapper] : wrappers_)
      call = [layer = l, w = wrapper, inner = std::move(call)](const at::Tensor& in) { return w(layer, in, inner); };
    BlockOutput o = call(out.x);
    out.x = o.x;
    out.aux_loss = out.aux_loss + o.aux_loss;
  }
  return out;
}

ModelOutput TransformerLMImpl::head(const at::Tensor& x, const at::Tensor& targets, const at::Tensor& aux_loss) {
  require(has_head(), "internal: head() on a model stage without the head (", stage_.describe(opts_), ")");
  const ShardHooks& hooks = shard_hooks_;
  ModelOutput out;
  out.aux_loss = aux_loss;
  through_end_wrappers(ModelPart::head(), [&] {
    out.logits = hooks.logits ? hooks.logits(ln_f(x)) : linear(ln_f->for_matmul(x), head_weight(), at::Tensor());
    fetch_when_gradient_reaches(x, out.logits);  // an offloaded last block comes back during the head's backward
    if (targets.defined()) {
      out.ce_loss = hooks.cross_entropy
                        ? hooks.cross_entropy(out.logits, targets)
                        : cross_entropy_mean(out.logits.reshape({-1, out.logits.size(-1)}), targets.reshape(-1));
      out.loss = out.ce_loss + out.aux_loss;
    }
  });
  return out;
}

ModelOutput TransformerLMImpl::forward(const at::Tensor& idx, const at::Tensor& targets) {
  if (targets.defined())
    require(targets.sizes() == idx.sizes(), "targets shape ", targets.sizes(), " differs from input shape ",
            idx.sizes());
  BlockOutput body = run_blocks(embed(idx));
  return head(body.x, targets, body.aux_loss);
}

}  // namespace tessera
