// The model's structure as parallelism sees it from outside: every parameter declared with its
// split and its placement (block, end, tied), block wrappers that compose, stages built from a layer range that reproduce the whole
// model, and construction on the meta device that counts without allocating and materialises to
// the same parameters.
#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include "model/init.h"
#include "model/transformer.h"
#include "test_util.h"
#include "model/model_size.h"

namespace tessera {
namespace {

ModelOptions tiny(const std::string& arch = "gpt", const std::string& ffn = "dense") {
  ModelOptions o;
  o.arch = arch;
  o.ffn = ffn;
  o.moe_every = 2;
  o.n_layer = 4;
  o.n_head = 2;
  o.n_embd = 16;
  o.vocab_size = 32;
  o.block_size = 16;
  return o;
}

TEST(ModelStructure, EveryParameterIsDeclaredWithItsSplit) {
  for (const auto& [arch, ffn] : {std::pair{"gpt", "dense"}, {"linear", "dense"}, {"gpt", "moe"}}) {
    TransformerLM model(tiny(arch, ffn));
    const ParameterSpecs& specs = model->parameter_specs();
    EXPECT_EQ(specs.size(), model->named_parameters().size()) << arch << " " << ffn;
    for (const auto& item : model->named_parameters()) EXPECT_TRUE(specs.count(item.key())) << item.key();
  }
  TransformerLM gpt(tiny());
  const ParameterSpecs& s = gpt->parameter_specs();
  EXPECT_EQ(s.at("wte.weight").split, Split::vocab);
  EXPECT_EQ(s.at("wpe.weight").split, Split::replicated);
  EXPECT_EQ(s.at("h.0.attn.c_attn.weight").split, Split::column);
  EXPECT_EQ(s.at("h.0.attn.c_attn.weight").parts, 3);
  EXPECT_EQ(s.at("h.0.attn.c_attn.bias").split, Split::column);
  EXPECT_EQ(s.at("h.0.attn.c_proj.weight").split, Split::row);
  EXPECT_EQ(s.at("h.0.attn.c_proj.bias").split, Split::replicated);
  EXPECT_EQ(s.at("h.3.mlp.c_fc.weight").split, Split::column);
  EXPECT_EQ(s.at("ln_f.weight").split, Split::replicated);
  TransformerLM linear(tiny("linear"));
  EXPECT_EQ(linear->parameter_specs().at("h.1.mlp.c_fc.weight").parts, 2);  // GLU: a, g
  EXPECT_EQ(linear->parameter_specs().at("h.1.attn.u_proj.weight").split, Split::column);
  EXPECT_EQ(linear->parameter_specs().at("h.1.attn.o_proj.weight").split, Split::row);
  TransformerLM moe(tiny("gpt", "moe"));
  EXPECT_EQ(moe->parameter_specs().at("h.1.moe.w_fc").split, Split::expert);
  EXPECT_EQ(moe->parameter_specs().at("h.1.moe.router.weight").split, Split::replicated);

  // Placement: the block of every block parameter, the end of the others, the tied embedding; the
  // same in a stage that holds blocks 2-3 and the head.
  for (const TransformerLM& m : {gpt, TransformerLM(tiny(), ModelStage(2, 4), at::TensorOptions().device(at::kMeta))})
    for (const auto& [name, spec] : m->parameter_specs()) {
      if (name.rfind("h.", 0) == 0) {
        EXPECT_EQ(spec.block, std::stoll(name.substr(2, name.find('.', 2) - 2))) << name;
        EXPECT_EQ(spec.end, ModelEnd::none) << name;
      } else {
        EXPECT_EQ(spec.block, -1) << name;
        EXPECT_EQ(spec.end, name.rfind("ln_f", 0) == 0 ? ModelEnd::head : ModelEnd::embedding) << name;
      }
      EXPECT_EQ(spec.tied, name == "wte.weight") << name;
    }

  // A parameter without a declaration is an error, not "replicated".
  torch::nn::Module module;
  module.register_parameter("undeclared", torch::zeros({2}));
  EXPECT_TRUE(test::throws_naming([&] { initialize_parameters(module, {}, 1); }, {"undeclared", "no declaration"}));
}

TEST(ModelStructure, BlockWrappersComposeOutsideEachOther) {
  torch::manual_seed(1);
  TransformerLM model(tiny());
  const at::Tensor idx = torch::randint(32, {2, 8});
  const at::Tensor plain = model->forward(idx).logits;
  std::vector<std::string> calls;
  auto recorder = [&calls](const std::string& name) {
    return [&calls, name](int64_t layer, const at::Tensor& x, const TransformerLMImpl::BlockCall& inner) {
      calls.push_back(name + " enter " + std::to_string(layer));
      BlockOutput out = inner(x);
      calls.push_back(name + " leave " + std::to_string(layer));
      return out;
    };
  };
  const int64_t inner = model->add_block_wrapper(recorder("inner"));
  const int64_t outer = model->add_block_wrapper(recorder("outer"));
  EXPECT_TRUE(test::all_close(model->forward(idx).logits, plain, 0, 0));
  ASSERT_EQ(calls.size(), 16u);
  EXPECT_EQ(calls[0], "outer enter 0");
  EXPECT_EQ(calls[1], "inner enter 0");
  EXPECT_EQ(calls[2], "inner leave 0");
  EXPECT_EQ(calls[3], "outer leave 0");
  model->remove_block_wrapper(outer);
  calls.clear();
  model->forward(idx);
  EXPECT_EQ(calls.size(), 8u);
  EXPECT_EQ(calls[0], "inner enter 0");
  model->remove_block_wrapper(inner);
  EXPECT_TRUE(test::throws_naming([&] { model->remove_block_wrapper(inner); }, {"no block wrapper"}));
  // Single-owner slots refuse a second owner instead of replacing the first.
  TransformerLMImpl::ShardHooks hooks;
  hooks.logits = [](const at::Tensor& h) { return h; };
  model->set_shard_hooks(hooks);
  EXPECT_TRUE(test::throws_naming([&] { model->set_shard_hooks(hooks); }, {"already installed"}));
  auto kernel = [](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) { return q; };
  model->block(0)->softmax_attn->set_kernel(kernel);
  EXPECT_TRUE(test::throws_naming([&] { model->block(0)->softmax_attn->set_kernel(kernel); }, {"already installed"}));
}

// Two stages of blocks [0, 2) and [2, 4), built after the same seed as the whole model, hold the
// same parameters under the same global names; run one after the other, passing the activation
// forward and its gradient back, they give the whole model's loss and every gradient.
TEST(ModelStructure, StagesReproduceTheWholeModel) {
  for (const char* arch : {"gpt", "linear"}) {
    const ModelOptions o = tiny(arch);
    torch::manual_seed(5);
    TransformerLM whole(o);
    torch::manual_seed(5);
    TransformerLM first(o, ModelStage{0, 2});
    torch::manual_seed(5);
    TransformerLM last(o, ModelStage{2, 4});
    EXPECT_TRUE(first->has_embedding() && !first->has_head());
    EXPECT_TRUE(!last->has_embedding() && last->has_head());
    auto all = whole->named_parameters();
    size_t held = 0;
    for (TransformerLM* stage : {&first, &last})
      for (const auto& item : (*stage)->named_parameters()) {
        ASSERT_TRUE(all.contains(item.key())) << arch << " " << item.key();
        EXPECT_TRUE(test::all_close(item.value(), all[item.key()], 0, 0)) << arch << " " << item.key();
        ++held;
      }
    EXPECT_EQ(held, all.size() + 1) << arch;  // wte on both ends
    EXPECT_FALSE(first->named_parameters().contains("ln_f.weight"));
    EXPECT_TRUE(last->named_parameters().contains("h.3.ln_1.weight"));
    EXPECT_FALSE(last->named_parameters().contains("h.1.ln_1.weight"));

    const at::Tensor idx = torch::randint(32, {2, 8}), targets = torch::randint(32, {2, 8});
    const ModelOutput reference = whole->forward(idx, targets);
    reference.loss.backward();
    const BlockOutput sent = first->run_blocks(first->embed(idx));
    const at::Tensor received = sent.x.detach().requires_grad_();
    const BlockOutput body = last->run_blocks(received);
    const ModelOutput out = last->head(body.x, targets, body.aux_loss);
    EXPECT_TRUE(test::all_close(out.loss, reference.loss, 1e-6, 1e-6)) << arch;
    out.loss.backward();
    sent.x.backward(received.grad());
    for (TransformerLM* stage : {&first, &last})
      for (const auto& item : (*stage)->named_parameters()) {
        if (item.key() == "wte.weight") continue;  // the tie: the two copies' gradients sum to the whole's
        EXPECT_TRUE(test::all_close(item.value().grad(), all[item.key()].grad(), 1e-5, 1e-6)) << arch << " " << item.key();
      }
    const at::Tensor tied = first->wte->weight.grad() + last->wte->weight.grad();
    EXPECT_TRUE(test::all_close(tied, whole->wte->weight.grad(), 1e-5, 1e-6)) << arch;
    EXPECT_TRUE(test::throws_naming([&] { last->forward(idx); }, {"without the embedding"}));
    EXPECT_TRUE(test::throws_naming([&] { first->block(2); }, {"block 2", "not in this model stage"}));
  }
}

TEST(ModelStructure, MetaDeviceCountsWithoutAllocatingAndMaterialisesTheSameModel) {
  const ModelOptions o = tiny("gpt", "moe");
  torch::manual_seed(9);
  TransformerLM direct(o);
  torch::manual_seed(9);
  TransformerLM deferred(o, ModelStage{}, at::TensorOptions().device(at::kMeta));
  int64_t numel = 0;
  for (const auto& p : deferred->parameters()) {
    EXPECT_TRUE(p.is_meta());
    numel += p.numel();
  }
  EXPECT_EQ(numel, parameter_count(o));
  TransformerLM built = materialize(*deferred, at::TensorOptions());
  auto expected = direct->named_parameters();
  for (const auto& item : built->named_parameters())
    EXPECT_TRUE(test::all_close(item.value(), expected[item.key()], 0, 0)) << item.key();
  EXPECT_TRUE(test::throws_naming([&] { materialize(*built, at::TensorOptions()); }, {"already on"}));
  // GPT-3 175B counted from its modules in a moment, without its 700 GB.
  const int64_t gpt3 = parameter_count(ModelOptions::from_preset("gpt3_175b"));
  EXPECT_NEAR(static_cast<double>(gpt3), 175e9, 0.005 * 175e9);
}

}  // namespace
}  // namespace tessera
