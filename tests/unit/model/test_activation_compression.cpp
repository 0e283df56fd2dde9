// The blocks' saved activations encoded (memory.activation_compression, model/block.h): lossless
// leaves every gradient bit-identical; the lossy codecs move gradients by about their rounding
// and shrink what autograd holds, for GPT, linear-attention and MoE blocks, with and without
// checkpointing, with dropout active.
#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include "memory/saved_activations.h"
#include "model/transformer.h"
#include "test_util.h"
#include "unit/model/small_model.h"

namespace tessera {
namespace {

ModelOptions model(const std::string& arch, const std::string& ffn, double dropout) {
  return test::small_model(arch, ffn, 64, dropout);
}

struct Step {
  at::Tensor loss;
  std::map<std::string, at::Tensor> grads;
  int64_t saved_bytes = 0;  // held by the blocks for backward after the forward
};

Step step(const ModelOptions& opts, const std::string& codec, const std::string& checkpointing = "none") {
  torch::manual_seed(11);
  TransformerLM m(opts);
  m->set_activation_checkpointing(checkpointing);
  m->set_activation_compression(codec);
  m->train();
  auto idx = torch::randint(0, opts.vocab_size, {4, 32});
  auto targets = torch::randint(0, opts.vocab_size, {4, 32});
  torch::manual_seed(12);  // dropout masks
  count_saved_activations(true);
  auto out = m->forward(idx, targets);
  Step s{out.loss.detach(), {}, saved_activation_bytes().live};
  out.loss.backward();
  count_saved_activations(false);
  for (auto& p : m->named_parameters()) s.grads[p.key()] = p.value().grad();
  return s;
}

// |g - g_ref| relative to the largest |g_ref| of the tensor, the worst over every parameter.
double worst_gradient_error(const Step& got, const Step& want) { return test::worst_relative_error(got.grads, want.grads); }

class ActivationCompression : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(ActivationCompression, LosslessIsExactAndLossyCodecsStayNearAndSave) {
  const auto [arch, ffn] = GetParam();
  const ModelOptions dropping = model(arch, ffn, 0.2);
  const Step none = step(dropping, "none");
  const Step lossless = step(dropping, "lossless");
  EXPECT_TRUE(lossless.loss.equal(none.loss));
  EXPECT_EQ(worst_gradient_error(lossless, none), 0) << "lossless must leave every gradient bit-identical";
  // Dropout's masks are bool (model/dropout.h), which lossless packs 8 to a byte.
  EXPECT_LT(lossless.saved_bytes, none.saved_bytes) << arch << "/" << ffn;
  std::printf("measured: %s/%s with dropout, saved bytes after forward: none %lld, lossless %lld\n", arch.c_str(),
              ffn.c_str(), static_cast<long long>(none.saved_bytes), static_cast<long long>(lossless.saved_bytes));
  // Lossy: the forward is unchanged (the loss is exact), the gradients move by the rounding.
  for (const auto& [codec, bound] : std::vector<std::pair<std::string, double>>{{"bf16", 0.02}, {"fp8", 0.15}, {"int8", 0.08}}) {
    const Step lossy = step(dropping, codec);
    EXPECT_TRUE(lossy.loss.equal(none.loss)) << codec;
    const double error = worst_gradient_error(lossy, none);
    EXPECT_GT(error, 0) << codec << ": nothing was encoded";
    EXPECT_LT(error, bound) << codec;
  }
  // Bytes held for backward, without dropout's masks.
  const ModelOptions plain = model(arch, ffn, 0);
  const Step f32 = step(plain, "none"), bf16 = step(plain, "bf16"), int8 = step(plain, "int8");
  ASSERT_GT(f32.saved_bytes, 0);
  const double bf16_ratio = static_cast<double>(bf16.saved_bytes) / f32.saved_bytes;
  const double int8_ratio = static_cast<double>(int8.saved_bytes) / f32.saved_bytes;
  // Every saved float32 activation of width >= 8 halves (bf16) or becomes 1 + 4/32 bytes per
  // element (int8); the norms' per-row statistics and integer routing tensors stay.
  EXPECT_LT(bf16_ratio, 0.56) << arch << "/" << ffn;
  EXPECT_LT(int8_ratio, 0.33) << arch << "/" << ffn;
  std::printf("measured: %s/%s saved bytes after forward: float32 %lld, bf16 %.3f, int8 %.3f of it\n", arch.c_str(),
              ffn.c_str(), static_cast<long long>(f32.saved_bytes), bf16_ratio, int8_ratio);
}

INSTANTIATE_TEST_SUITE_P(Blocks, ActivationCompression,
                         ::testing::Values(std::make_tuple("gpt", "dense"), std::make_tuple("linear", "dense"),
                                           std::make_tuple("gpt", "moe")),
                         [](const auto& info) { return std::get<0>(info.param) + "_" + std::get<1>(info.param); });

// Under full checkpointing a block saves only its input, which the codec encodes; the
// recomputation then starts from the decoded input. Selective checkpointing encodes the
// checkpointed attention core's inputs the same way.
TEST(ActivationCompression, CheckpointedBlocksEncodeWhatTheyKeep) {
  const ModelOptions opts = model("gpt", "dense", 0);
  for (const std::string mode : {"full", "selective"}) {
    const Step none = step(opts, "none", mode), int8 = step(opts, "int8", mode);
    EXPECT_LT(int8.saved_bytes, none.saved_bytes * 0.33) << mode;
    const double error = worst_gradient_error(int8, none);
    EXPECT_GT(error, 0) << mode;
    EXPECT_LT(error, 0.08) << mode;
  }
  EXPECT_LT(step(opts, "none", "full").saved_bytes, step(opts, "none", "selective").saved_bytes);
}

}  // namespace
}  // namespace tessera
