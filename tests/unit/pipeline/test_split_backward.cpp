// SplitBackward (parallel/pipeline/split_backward.h): I then W give what one whole backward gives,
// and each runs only its own products: I the input-gradient matmuls, W the weight-gradient ones,
// with no forward op and no attention backward in W.
#include <functional>
#include <map>
#include <string>

#include <ATen/record_function.h>
#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include "model/linear.h"
#include "model/transformer.h"
#include "parallel/pipeline/split_backward.h"
#include "tiny_config.h"

namespace tessera {
namespace {

// Counts the aten ops run while it lives (by name).
class OpCounter {
 public:
  OpCounter() {
    handle_ = at::addThreadLocalCallback(
        at::RecordFunctionCallback([](const at::RecordFunction& fn) -> std::unique_ptr<at::ObserverContext> {
          ++counts()[fn.name()];
          return nullptr;
        }).scopes({at::RecordScope::FUNCTION}));
    counts().clear();
  }
  ~OpCounter() { at::removeCallback(handle_); }
  int64_t operator[](const std::string& op) const {
    const auto it = counts().find(op);
    return it == counts().end() ? 0 : it->second;
  }
  static std::map<std::string, int64_t>& counts() {
    static thread_local std::map<std::string, int64_t> c;
    return c;
  }

 private:
  at::CallbackHandle handle_;
};

struct Pass {
  at::Tensor input_grad;
  std::map<std::string, at::Tensor> grads;
  int64_t mm_in_i = 0, mm_in_w = 0, mm_whole = 0, forward_ops_in_w = 0, attention_in_w = 0;
};

// A middle stage (its input a leaf) or stage 0 (its input the embedding's output), tiny GPT.
Pass run(bool split, bool from_embedding) {
  torch::manual_seed(0);
  Config c = test::tiny_config(16);
  c.model.dropout = 0.0;
  TransformerLM model(c.model);
  const at::Tensor idx = torch::randint(c.model.vocab_size, {2, 16}), targets = torch::randint(c.model.vocab_size, {2, 16});
  at::Tensor input;
  if (from_embedding) input = model->embed(idx);
  else input = torch::randn({2, 16, c.model.n_embd}).requires_grad_(true);
  const BlockOutput blocks = model->run_blocks(input);
  const at::Tensor loss = model->head(blocks.x, targets, blocks.aux_loss).loss;
  std::vector<at::Tensor> params;
  for (const auto& p : model->parameters()) params.push_back(p);
  Pass out;
  if (split) {
    at::Tensor grad_in;
    std::optional<pipeline::SplitBackward> sb;
    {
      OpCounter count;
      sb.emplace(std::vector<at::Tensor>{loss}, std::vector<at::Tensor>{at::ones_like(loss)}, input, params);
      out.mm_in_i = count["aten::mm"];
    }
    out.input_grad = sb->input_gradient();
    for (const auto& p : params) EXPECT_FALSE(p.grad().defined()) << "I accumulated a parameter's gradient";
    OpCounter count;
    sb->weight_gradients();
    out.mm_in_w = count["aten::mm"];
    for (const char* op : {"aten::addmm", "aten::linear", "aten::layer_norm", "aten::gelu", "aten::embedding"})
      out.forward_ops_in_w += count[op];
    for (const auto& [name, n] : OpCounter::counts())
      if (name.find("attention") != std::string::npos || name == "aten::bmm") out.attention_in_w += n;
  } else {
    if (from_embedding) input.retain_grad();
    OpCounter count;
    loss.backward();
    out.mm_whole = count["aten::mm"];
    out.input_grad = input.grad();
  }
  for (const auto& item : model->named_parameters()) out.grads[item.key()] = item.value().grad();
  return out;
}

void expect_same_gradients(const Pass& whole, const Pass& split) {
  EXPECT_TRUE(torch::equal(whole.input_grad, split.input_grad));
  ASSERT_EQ(whole.grads.size(), split.grads.size());
  for (const auto& [name, g] : whole.grads) {
    if (!g.defined()) {  // not used by this stage (a middle stage's embedding)
      EXPECT_FALSE(split.grads.at(name).defined()) << name;
      continue;
    }
    ASSERT_TRUE(split.grads.at(name).defined()) << name << " got no gradient from W";
    EXPECT_TRUE(torch::allclose(g, split.grads.at(name), 1e-6, 1e-7)) << name;
  }
}

TEST(SplitBackward, IThenWGiveTheWholeBackwardsGradientsForAMiddleStage) {
  const Pass whole = run(false, false), split = run(true, false);
  expect_same_gradients(whole, split);
}

TEST(SplitBackward, Stage0StopsAtTheEmbeddingAndWFillsItsGradient) {
  const Pass whole = run(false, true), split = run(true, true);
  expect_same_gradients(whole, split);
}

TEST(SplitBackward, WRunsOnlyTheWeightProducts) {
  const Pass whole = run(false, false), split = run(true, false);
  EXPECT_EQ(split.mm_in_i + split.mm_in_w, whole.mm_whole) << "I and W together do one backward's products";
  // Tiny GPT, 2 blocks: c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj per block, and the tied head.
  const int64_t linears = 2 * 4 + 1;
  EXPECT_EQ(split.mm_in_w, linears) << "W computes one weight product per linear layer";
  EXPECT_EQ(split.mm_in_i, linears) << "I computes one input product per linear layer";
  EXPECT_EQ(split.forward_ops_in_w, 0) << "W re-ran a forward op";
  EXPECT_EQ(split.attention_in_w, 0) << "W re-ran the attention's backward (an input-path op)";
}

// The gradient of `input` from `loss`, and the parameters' in their .grad: by one whole backward, or
// split into I and then W (`after_i` runs between them).
at::Tensor backward_of(bool split, const at::Tensor& loss, const at::Tensor& input, const std::vector<at::Tensor>& params,
                       const std::function<void()>& after_i = {}) {
  if (!split) {
    loss.backward();
    return input.grad();
  }
  pipeline::SplitBackward sb({loss}, {at::ones_like(loss)}, input, params);
  if (after_i) after_i();
  const at::Tensor input_grad = sb.input_gradient();
  sb.weight_gradients();
  return input_grad;
}

// The split run's gradients are bitwise the whole run's.
void expect_equal_gradients(const std::map<std::string, at::Tensor>& whole,
                            const std::map<std::string, at::Tensor>& split) {
  for (const auto& [name, g] : whole) {
    ASSERT_TRUE(split.at(name).defined()) << name;
    EXPECT_TRUE(torch::equal(g, split.at(name))) << name;
  }
}

// A custom function that saves its input without the input's graph (model/linear.cpp's, whose
// weight gradient leaves the GEMM in float32) holds the node that made its input by its edge alone:
// cutting that edge while W's roots are gathered must not free a node still to be visited.
TEST(SplitBackward, ACustomFunctionHoldingItsInputsNodeByItsEdgeAloneSplitsExactly) {
  std::map<std::string, at::Tensor> grads[2];
  for (int split = 0; split < 2; ++split) {
    torch::manual_seed(1);
    const at::Tensor x = torch::randn({4, 8}).requires_grad_(true);
    const at::Tensor w = (torch::randn({6, 8}) * 0.3).requires_grad_(true);
    const at::Tensor bias = torch::randn({6}).requires_grad_(true);
    const at::Tensor gamma = torch::randn({8}).requires_grad_(true), beta = torch::randn({8}).requires_grad_(true);
    // The layer norm's output is dropped here, as a model's forward drops it: the function's edge
    // is what keeps its node. The linear's parameters come first, so W's roots visit its node first.
    const at::Tensor loss = linear_fp32_weight_grads(at::layer_norm(x, {8}, gamma, beta), {w}, {bias})
                                .to(at::kFloat).pow(2).sum();
    const at::Tensor input_grad = backward_of(split, loss, x, {w, bias, gamma, beta});
    grads[split] = {{"x", input_grad}, {"w", w.grad()}, {"bias", bias.grad()}, {"gamma", gamma.grad()},
                    {"beta", beta.grad()}};
  }
  expect_equal_gradients(grads[0], grads[1]);
}

// After I, what the input path's own nodes saved is released at once, not kept until W: here
// GELU's input, which GELU alone saves, while the second product's saved input (GELU's output)
// would keep GELU's node, and so its saved tensors, alive through its grad_fn. The gradients stay
// those of one whole backward.
TEST(SplitBackward, IReleasesWhatTheInputPathSavedAndWStillGivesTheWholeGradients) {
  std::map<std::string, at::Tensor> grads[2];
  for (int split = 0; split < 2; ++split) {
    torch::manual_seed(2);
    const at::Tensor x = torch::randn({32, 16}).requires_grad_(true);
    const at::Tensor w1 = (torch::randn({64, 16}) * 0.3).requires_grad_(true);
    const at::Tensor w2 = (torch::randn({16, 64}) * 0.3).requires_grad_(true);
    c10::weak_intrusive_ptr<c10::StorageImpl> gelu_input(c10::intrusive_ptr<c10::StorageImpl>::reclaim(nullptr));
    at::Tensor loss;
    {
      const at::Tensor h = at::linear(x, w1);
      gelu_input = h.storage().getWeakStorageImpl();
      loss = at::linear(at::gelu(h), w2).pow(2).sum();
    }
    ASSERT_FALSE(gelu_input.expired()) << "GELU saves its input for its backward";
    const at::Tensor input_grad = backward_of(split, loss, x, {w1, w2}, [&] {
      EXPECT_TRUE(gelu_input.expired()) << "I kept GELU's saved input until W";
    });
    grads[split] = {{"x", input_grad}, {"w1", w1.grad()}, {"w2", w2.grad()}};
  }
  expect_equal_gradients(grads[0], grads[1]);
}

}  // namespace
}  // namespace tessera
