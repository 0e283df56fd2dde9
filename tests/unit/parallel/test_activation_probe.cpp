// Codecs chosen per saved tensor (memory.activation_compression = adaptive; memory/adaptive_codecs.h,
// parallel/activation_probe.h): the choice spends its bits where the measured error is largest;
// at the budget's two ends a model trains bit for bit as with one codec everywhere; in between it
// mixes codecs, holds its bits and moves the gradients less than int4 everywhere; with dropout too.
#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <map>
#include <string>

#include "memory/saved_activations.h"
#include "model/transformer.h"
#include "parallel/activation_probe.h"
#include "test_util.h"
#include "unit/model/small_model.h"

namespace tessera {
namespace {

SavedSlot float_slot(int64_t elements) { return {elements, 4, true, "MmBackward0"}; }

TEST(AdaptiveCodecs, TheBudgetGoesToTheMostSensitiveTensorsFirst) {
  // Three float32 slots of 32 elements: int4 holds 5 bits an element, int8 9, kept 32.
  const BlockSlots slots{{0, {float_slot(32), float_slot(32)}}, {1, {float_slot(32)}}};
  const SlotErrors errors{{0, {1.0, 100.0}}, {1, {10.0}}};
  auto choose = [&](double bits) { return choose_slot_codecs(slots, errors, bits); };
  using C = ActivationCodec;
  EXPECT_EQ(choose(5), (SlotCodecs{{0, {C::int4, C::int4}}, {1, {C::int4}}}));
  // Room for one int8: the slot of error 100.
  EXPECT_EQ(choose(5 + 4.0 / 3), (SlotCodecs{{0, {C::int4, C::int8}}, {1, {C::int4}}}));
  EXPECT_EQ(choose(5 + 8.0 / 3), (SlotCodecs{{0, {C::int4, C::int8}}, {1, {C::int8}}}));
  // Every slot at int8, then room for one kept: again the most sensitive.
  EXPECT_EQ(choose(9 + 23.0 / 3), (SlotCodecs{{0, {C::int8, C::none}}, {1, {C::int8}}}));
  EXPECT_EQ(choose(32), (SlotCodecs{{0, {C::none, C::none}}, {1, {C::none}}}));
  // A slot no lossy codec encodes keeps its bits whatever it gets, and counts them.
  const BlockSlots narrow{{0, {float_slot(32), {32, 4, false, "MmBackward0"}}}};
  const SlotErrors narrow_errors{{0, {1.0, 1000.0}}};
  const SlotCodecs chosen = choose_slot_codecs(narrow, narrow_errors, (9 + 32) / 2.0);
  EXPECT_EQ(chosen.at(0)[0], C::int8);
  EXPECT_DOUBLE_EQ(summarize_slot_codecs(narrow, chosen).bits_per_element, (9 + 32) / 2.0);
  for (double bits : {5.0, 6.0, 7.5, 12.0, 20.0})
    EXPECT_LE(summarize_slot_codecs(slots, choose(bits)).bits_per_element, bits + 1e-12) << bits;
}

struct Step {
  at::Tensor loss;
  std::map<std::string, at::Tensor> grads;
  int64_t saved_bytes = 0;
  int64_t probe_peak = 0;  // the most saved bytes held at once during the probe before the step
};

const at::Tensor& tokens(int which) {
  static const at::Tensor idx = (torch::manual_seed(21), torch::randint(0, 50, {4, 32}));
  static const at::Tensor targets = (torch::manual_seed(22), torch::randint(0, 50, {4, 32}));
  return which == 0 ? idx : targets;
}

TransformerLM model(const ModelOptions& opts) {
  torch::manual_seed(11);
  TransformerLM m(opts);
  m->train();
  return m;
}

Step step(TransformerLM& m) {
  count_saved_activations(true);
  auto out = m->forward(tokens(0), tokens(1));
  Step s{out.loss.detach(), {}, saved_activation_bytes().live};
  out.loss.backward();
  count_saved_activations(false);
  for (auto& p : m->named_parameters()) {
    s.grads[p.key()] = p.value().grad().clone();
    p.value().mutable_grad() = at::Tensor();
  }
  return s;
}

Step with_codec(const ModelOptions& opts, const std::string& codec) {
  TransformerLM m = model(opts);
  m->set_activation_compression(codec);
  return step(m);
}

// The probe, then a step with the codecs it chose.
Step adaptive(const ModelOptions& opts, double bits, ActivationProbe* probe_out = nullptr) {
  TransformerLM m = model(opts);
  auto codecs = std::make_shared<AdaptiveCodecs>(bits);
  m->set_adaptive_activation_codecs(codecs);
  count_saved_activations(true);
  reset_saved_activation_peak();
  const ActivationProbe probe = probe_activation_codecs(
      m, *codecs, [&] { census_backward(m, m->forward(tokens(0), tokens(1)).loss); },
      [](Block& block, const at::Tensor& x) { return block->forward(x).x; });
  const int64_t probe_peak = saved_activation_bytes().peak;
  count_saved_activations(false);
  for (auto& p : m->parameters()) EXPECT_FALSE(p.grad().defined()) << "the probe left a gradient";
  if (probe_out) *probe_out = probe;
  Step s = step(m);
  s.probe_peak = probe_peak;
  return s;
}

// |g - g_ref| relative to the largest |g_ref| of the tensor, the worst over every parameter.
double worst_gradient_error(const Step& got, const Step& want) { return test::worst_relative_error(got.grads, want.grads); }

bool same(const Step& a, const Step& b) {
  if (!a.loss.equal(b.loss)) return false;
  for (const auto& [name, g] : b.grads)
    if (!a.grads.at(name).equal(g)) return false;
  return true;
}

class AdaptiveModel : public ::testing::TestWithParam<std::string> {};

TEST_P(AdaptiveModel, TheBudgetsEndsTrainAsOneCodecAndItsMiddleMixes) {
  const ModelOptions opts = test::small_model(GetParam(), "dense", 64, 0);
  const Step none = with_codec(opts, "none"), int4 = with_codec(opts, "int4");
  // 5 bits an element: every slot int4, as the int4 codec encodes the whole block.
  EXPECT_TRUE(same(adaptive(opts, 5), int4));
  // 32 bits: every slot kept, as without a codec.
  EXPECT_TRUE(same(adaptive(opts, 32), none));
  ActivationProbe probe;
  const Step mixed = adaptive(opts, 7, &probe);
  const SlotChoiceSummary s = summarize_slot_codecs(probe.slots, probe.codecs);
  EXPECT_EQ(probe.slots.size(), 2u);
  EXPECT_GT(s.int4, 0);
  EXPECT_GT(s.int8 + s.kept, 0);
  EXPECT_LE(s.bits_per_element, 7 + 1e-9);
  for (const auto& [layer, errors] : probe.int4_error)
    for (double e : errors) EXPECT_GE(e, 0);
  // Between int4's bytes and none's, and nearer none's gradients than int4 everywhere.
  EXPECT_GT(mixed.saved_bytes, int4.saved_bytes);
  EXPECT_LT(mixed.saved_bytes, none.saved_bytes);
  EXPECT_LT(worst_gradient_error(mixed, none), worst_gradient_error(int4, none));
  // The probe holds the census at int4 or one block kept, never the model's whole activations kept
  // (which the step at a budget is meant not to need).
  const int64_t probe_bound = std::max(int4.saved_bytes, none.saved_bytes / opts.n_layer);
  EXPECT_LE(mixed.probe_peak, probe_bound);
  EXPECT_LT(probe_bound, none.saved_bytes);
  std::printf("measured: %s adaptive at 7 bits: %lld tensors (%lld kept, %lld int8, %lld int4), %.2f bits; saved "
              "bytes none %lld, int4 %lld, adaptive %lld, the probe's peak %lld; worst gradient error int4 %.3g, "
              "adaptive %.3g\n%s\n",
              GetParam().c_str(), static_cast<long long>(s.slots), static_cast<long long>(s.kept),
              static_cast<long long>(s.int8), static_cast<long long>(s.int4), s.bits_per_element,
              static_cast<long long>(none.saved_bytes), static_cast<long long>(int4.saved_bytes),
              static_cast<long long>(mixed.saved_bytes), static_cast<long long>(mixed.probe_peak),
              worst_gradient_error(int4, none),
              worst_gradient_error(mixed, none),
              describe_activation_codecs(probe.slots, probe.codecs, 7, probe.seconds).c_str());
}

INSTANTIATE_TEST_SUITE_P(Blocks, AdaptiveModel, ::testing::Values("gpt", "linear"));

// MoE blocks (capacity and dropless routing): the experts run stacked, so a block saves the same
// tensors whatever its routing, and the budget's ends train as int4 and none.
TEST(AdaptiveMoE, StackedExpertsSaveTheSameTensorsWhateverTheRoutingAndTheProbeIsNoStepForwardOfTheirs) {
  tokens(0);
  for (double capacity : {1.25, 0.0}) {
    ModelOptions opts = test::small_model("gpt", "moe", 64, 0);
    opts.moe_capacity_factor = capacity;
    const Step none = with_codec(opts, "none"), int4 = with_codec(opts, "int4");
    EXPECT_TRUE(same(adaptive(opts, 5), int4)) << capacity;
    EXPECT_TRUE(same(adaptive(opts, 32), none)) << capacity;
    ActivationProbe probe;
    const Step mixed = adaptive(opts, 7, &probe);
    EXPECT_LT(worst_gradient_error(mixed, none), worst_gradient_error(int4, none)) << capacity;
    // Another batch routes otherwise and saves as many tensors in each block.
    TransformerLM m = model(opts);
    auto codecs = std::make_shared<AdaptiveCodecs>(7.0);
    m->set_adaptive_activation_codecs(codecs);
    const at::Tensor other = (torch::manual_seed(23), torch::randint(0, 50, {4, 32}));
    // A balance count sum installed (model.moe_aux_scope = global) is not called by the probe,
    // and its forwards leave the layers' statistics as they were (the loads, the bias's update).
    int64_t sums = 0;
    for (int64_t layer : m->layers()) m->block(layer)->moe->set_balance_count_sum([&](at::Tensor&) { ++sums; });
    m->forward(other, tokens(1));
    const ActivationProbe again = probe_activation_codecs(
        m, *codecs, [&] { census_backward(m, m->forward(other, tokens(1)).loss); },
        [](Block& block, const at::Tensor& x) { return block->forward(x).x; });
    for (const auto& [layer, slots] : probe.slots)
      EXPECT_EQ(again.slots.at(layer).size(), slots.size()) << capacity << " block " << layer;
    EXPECT_EQ(sums, static_cast<int64_t>(m->layers().size())) << "the step's forward sums its counts, the probe's not";
    for (int64_t layer : m->layers()) {
      EXPECT_EQ(m->block(layer)->moe->statistics().forwards, 1) << capacity << " block " << layer;
      EXPECT_TRUE(m->block(layer)->moe->take_balance_count_sum()) << "the probe put the count sum back";
    }
  }
}

// With dropout each block run alone draws the masks it drew in the census (the probe stops when a
// block's output differs from the census's), and the streams end as the probe found them: at the
// budget's ends a step is bit for bit int4's and none's with the same masks.
TEST(AdaptiveDropout, TheProbeDrawsTheCensussMasksAndLeavesTheStreamsAsItFoundThem) {
  tokens(0);  // drawn once, before any model: every run below starts from seed 11's stream
  for (const char* arch : {"gpt", "linear"}) {
    const ModelOptions opts = test::small_model(arch, "dense", 64, 0.2);
    const Step none = with_codec(opts, "none"), int4 = with_codec(opts, "int4");
    EXPECT_FALSE(same(none, with_codec(test::small_model(arch, "dense", 64, 0), "none"))) << arch << ": no masks drawn";
    EXPECT_TRUE(same(adaptive(opts, 5), int4)) << arch;
    EXPECT_TRUE(same(adaptive(opts, 32), none)) << arch;
    ActivationProbe probe;
    const Step mixed = adaptive(opts, 7, &probe);
    const SlotChoiceSummary s = summarize_slot_codecs(probe.slots, probe.codecs);
    EXPECT_GT(s.int4, 0) << arch;
    EXPECT_GT(s.int8 + s.kept, 0) << arch;
    EXPECT_LT(worst_gradient_error(mixed, none), worst_gradient_error(int4, none)) << arch;
  }
}

}  // namespace
}  // namespace tessera
