// The blocks' saved activations in host memory between forward and backward
// (memory.activation_offload; memory/activation_offload.h): every gradient is bit-identical to the
// resident run, with and without compression and checkpointing, for GPT, linear-attention and MoE
// blocks with dropout; the device holds two blocks' saved bytes over the backward; every fetch is
// issued ahead of its backward; micro-batches whose forwards interleave (a pipeline's) fetch their
// own copies.
#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <chrono>
#include <thread>

#include "memory/activation_offload.h"
#include "memory/saved_activations.h"
#include "model/transformer.h"
#include "unit/model/small_model.h"

namespace tessera {
namespace offload_test {
namespace {

ModelOptions model(const std::string& arch, const std::string& ffn, double dropout, int64_t layers = 4) {
  ModelOptions o = test::small_model(arch, ffn, 64, dropout);
  o.n_layer = layers;
  return o;
}

struct Setting {
  std::string codec = "none", checkpointing = "none";
  int64_t offload = 0;         // blocks offloaded
  double bandwidth = 0;        // bytes per second of the modelled link (0: memcpy)
  int64_t micro_batches = 1;   // forwards run before any backward
};

struct Step {
  std::vector<at::Tensor> losses;
  std::map<std::string, at::Tensor> grads;
  SavedActivationBytes bytes;  // over the backward (the host peak: over the whole step)
  int64_t forward_peak = 0;    // on the device, during the forward
  ActivationOffloadStats offload;
};

Step step(const ModelOptions& opts, const Setting& s) {
  torch::manual_seed(11);
  TransformerLM m(opts);
  m->set_activation_checkpointing(s.checkpointing);
  m->set_activation_compression(s.codec);
  if (s.offload > 0) m->set_activation_offload(s.offload, std::make_shared<ActivationOffload>(at::kCPU, s.bandwidth));
  m->train();
  torch::manual_seed(12);  // data, then dropout masks
  std::vector<ModelOutput> outs;
  count_saved_activations(true);
  reset_saved_activation_peak();
  reset_activation_offload_stats();
  for (int64_t i = 0; i < s.micro_batches; ++i) {
    auto idx = torch::randint(0, opts.vocab_size, {4, 32});
    auto targets = torch::randint(0, opts.vocab_size, {4, 32});
    outs.push_back(m->forward(idx, targets));
  }
  Step result;
  // The device's peak is compared over the backward, once every store has ended: how fast the
  // store stream keeps up with the forward depends on the machine's load, the backward's fetches
  // and releases do not.
  for (int i = 0; i < 10000 && saved_activation_bytes().host < activation_offload_stats().stored_bytes; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  result.forward_peak = saved_activation_bytes().peak;
  reset_saved_activation_peak();
  for (auto& out : outs) {  // first in, first out: as 1F1B runs its micro-batches
    result.losses.push_back(out.loss.detach());
    out.loss.backward();
    out = {};
  }
  result.bytes = saved_activation_bytes();
  result.offload = activation_offload_stats();
  count_saved_activations(false);
  for (auto& p : m->named_parameters()) result.grads[p.key()] = p.value().grad();
  return result;
}

void expect_identical(const Step& got, const Step& want, const std::string& what) {
  ASSERT_EQ(got.losses.size(), want.losses.size());
  for (size_t i = 0; i < want.losses.size(); ++i) EXPECT_TRUE(got.losses[i].equal(want.losses[i])) << what;
  for (const auto& [name, g] : want.grads) EXPECT_TRUE(got.grads.at(name).equal(g)) << what << ": " << name;
}

class Offload : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(Offload, GradientsAreBitIdenticalAndTheDeviceHoldsLess) {
  const auto [arch, ffn] = GetParam();
  const ModelOptions opts = model(arch, ffn, 0.2);
  for (const std::string codec : {"none", "int8"})
    for (const std::string checkpointing : {"none", "selective", "full"}) {
      const std::string what = codec + ", checkpointing " + checkpointing;
      const Step resident = step(opts, {codec, checkpointing});
      const Step offloaded = step(opts, {codec, checkpointing, opts.n_layer});
      expect_identical(offloaded, resident, what);
      // Every block's group went to the host and came back.
      EXPECT_EQ(offloaded.offload.groups, opts.n_layer) << what;
      EXPECT_GT(offloaded.bytes.host_peak, 0) << what;
      EXPECT_EQ(offloaded.bytes.host, 0) << what << ": host copies left after the backward";
      EXPECT_EQ(offloaded.bytes.live, 0) << what << ": device copies left after the backward";
      EXPECT_EQ(offloaded.bytes.host_peak, offloaded.offload.stored_bytes) << what << ": every store ended";
      // Over the backward the device held two of the four blocks' groups at once (the one used,
      // the one fetched ahead) beside what is not offloaded (the CPU's float dropout masks, off the
      // gradient's path): the resident peak less half the offloaded bytes (MoE blocks' groups differ
      // a little in size, hence the 1%).
      EXPECT_LE(offloaded.bytes.peak, resident.bytes.peak - offloaded.bytes.host_peak / 2 + resident.bytes.peak / 100)
          << what;
      std::printf("measured: %s/%s %s: device peak %lld of %lld bytes resident over the backward (%lld over the "
                  "forward), host peak %lld\n",
                  arch.c_str(), ffn.c_str(), what.c_str(), static_cast<long long>(offloaded.bytes.peak),
                  static_cast<long long>(resident.bytes.peak), static_cast<long long>(offloaded.forward_peak),
                  static_cast<long long>(offloaded.bytes.host_peak));
    }
}

INSTANTIATE_TEST_SUITE_P(Blocks, Offload,
                         ::testing::Values(std::make_tuple("gpt", "dense"), std::make_tuple("linear", "dense"),
                                           std::make_tuple("gpt", "moe")),
                         [](const auto& info) { return std::get<0>(info.param) + "_" + std::get<1>(info.param); });

// Block b's output hook fetches the group of the block before it, and the head's logits the last
// block's, so every fetch is issued ahead of the backward that unpacks it: none by an unpack, and
// with a link slow enough to show it, the last block's fetch waited for less than it took.
TEST(Offload, FetchesAreIssuedAheadOfTheBackwardThatNeedsThem) {
  const ModelOptions opts = model("gpt", "dense", 0, 6);
  const double bandwidth = 2e9;  // slow enough that a fetch without lead is seen waiting
  const Step ahead = step(opts, {"none", "none", opts.n_layer - 1, bandwidth});
  EXPECT_EQ(ahead.offload.groups, opts.n_layer - 1);
  EXPECT_EQ(ahead.offload.exposed_fetches, 0);
  const Step all = step(opts, {"none", "none", opts.n_layer, bandwidth});
  EXPECT_EQ(all.offload.exposed_fetches, 0);
  // The throttle holds: every byte copied crossed the link at no more than its bandwidth (a group
  // its backward reached before its store ended moves less).
  EXPECT_GT(all.offload.copied_to_host, 0);
  EXPECT_GT(all.offload.copied_to_device, 0);
  EXPECT_GE(all.offload.store_s, static_cast<double>(all.offload.copied_to_host) / bandwidth * 0.99);
  EXPECT_GE(all.offload.fetch_s, static_cast<double>(all.offload.copied_to_device) / bandwidth * 0.99);
  std::printf("measured: fetch wait %.2f ms of %.2f ms fetching (last block resident), %.2f of %.2f (all offloaded)\n",
              1e3 * ahead.offload.fetch_wait_s, 1e3 * ahead.offload.fetch_s, 1e3 * all.offload.fetch_wait_s,
              1e3 * all.offload.fetch_s);
}

// A pipeline stage's blocks, whose output gradient comes from the next stage: asked for the group
// that made the stage's output (as the pipeline does when it posts that gradient's receive), the
// last block's copies come back before any backward; the backward then waits on no unpack and
// trains as the resident stage does. An unrelated tensor fetches nothing.
TEST(Offload, AStagesLastBlockIsFetchedWhenItsOutputIsNamed) {
  const ModelOptions opts = model("gpt", "dense", 0, 2);
  auto stage = [&](bool offload, bool name_output) {
    torch::manual_seed(11);
    TransformerLM m(opts);
    if (offload) m->set_activation_offload(opts.n_layer, std::make_shared<ActivationOffload>(at::kCPU, 0));
    m->train();
    torch::manual_seed(12);
    reset_activation_offload_stats();
    const at::Tensor x = m->embed(torch::randint(0, opts.vocab_size, {4, 32}));
    const at::Tensor out = m->run_blocks(x, 0, opts.n_layer).x;
    for (int i = 0; i < 10000 && activation_offload_stats().copied_to_host < activation_offload_stats().stored_bytes; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    fetch_activations_that_made(x);  // not a block's output: nothing
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_EQ(activation_offload_stats().copied_to_device, 0);
    if (name_output) {
      fetch_activations_that_made(out);
      for (int i = 0; i < 10000 && activation_offload_stats().copied_to_device == 0; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    const ActivationOffloadStats before_backward = activation_offload_stats();
    out.backward(torch::ones_like(out));
    std::map<std::string, at::Tensor> grads;
    for (auto& p : m->named_parameters())
      if (p.value().grad().defined()) grads[p.key()] = p.value().grad();  // not the final norm's
    return std::make_tuple(before_backward, activation_offload_stats(), grads);
  };
  const auto [before, after, grads] = stage(true, true);
  EXPECT_EQ(before.groups, opts.n_layer);
  EXPECT_GT(before.copied_to_device, 0);                                 // the last block's, ahead
  EXPECT_LT(before.copied_to_device, after.copied_to_device);            // the first block's, in the backward
  EXPECT_EQ(after.copied_to_device, after.copied_to_host);               // each group once
  EXPECT_EQ(after.exposed_fetches, 0);
  const auto resident = std::get<2>(stage(false, false));
  ASSERT_EQ(grads.size(), resident.size());
  for (const auto& [name, g] : resident) EXPECT_TRUE(grads.at(name).equal(g)) << name;
}

// Two micro-batches' forwards before either backward (as a pipeline rank holds them): each block
// output links to its own micro-batch's groups, and the gradients equal the resident run's.
TEST(Offload, InterleavedMicroBatchesFetchTheirOwnActivations) {
  const ModelOptions opts = model("gpt", "dense", 0.2);
  Setting resident;
  resident.micro_batches = 2;
  Setting offloaded = resident;
  offloaded.offload = 2;  // the first half: a block after an offloaded one links to it
  const Step r = step(opts, resident), o = step(opts, offloaded);
  expect_identical(o, r, "two micro-batches");
  EXPECT_EQ(o.offload.groups, 4);
  EXPECT_EQ(o.offload.exposed_fetches, 0);
}

// A block whose backward comes before its store ended (here every store crawls over a 2 MB/s
// link) is kept on the device: no fetch, no second copy, the same gradients.
TEST(Offload, ABlockReachedBeforeItsStoreEndedIsKeptNotCopiedBack) {
  const ModelOptions opts = model("gpt", "dense", 0);
  const Step resident = step(opts, {});
  // step() waits for the stores before the backward; this forward and backward run at once.
  torch::manual_seed(11);
  TransformerLM m(opts);
  m->set_activation_offload(opts.n_layer, std::make_shared<ActivationOffload>(at::kCPU, 2e6));
  torch::manual_seed(12);
  auto idx = torch::randint(0, opts.vocab_size, {4, 32});
  auto targets = torch::randint(0, opts.vocab_size, {4, 32});
  reset_activation_offload_stats();
  count_saved_activations(true);
  auto out = m->forward(idx, targets);
  out.loss.backward();
  out = {};
  const SavedActivationBytes bytes = saved_activation_bytes();
  count_saved_activations(false);
  const ActivationOffloadStats stats = activation_offload_stats();
  EXPECT_GE(stats.kept_groups, 1);
  EXPECT_EQ(stats.exposed_fetches, 0);
  EXPECT_EQ(bytes.live, 0);
  EXPECT_EQ(bytes.host, 0);
  for (const auto& p : m->named_parameters())
    EXPECT_TRUE(p.value().grad().equal(resident.grads.at(p.key()))) << p.key();
  std::printf("measured: %lld of %lld groups kept on the device\n", static_cast<long long>(stats.kept_groups),
              static_cast<long long>(stats.groups));
}

// A forward whose graph is dropped without a backward (an evaluation under grad mode) frees its
// host copies.
TEST(Offload, AGraphDroppedWithoutBackwardFreesItsCopies) {
  const ModelOptions opts = model("gpt", "dense", 0);
  TransformerLM m(opts);
  m->set_activation_offload(opts.n_layer, std::make_shared<ActivationOffload>(at::kCPU, 0));
  count_saved_activations(true);
  {
    auto out = m->forward(torch::randint(0, opts.vocab_size, {2, 32}), torch::randint(0, opts.vocab_size, {2, 32}));
  }
  const SavedActivationBytes after = saved_activation_bytes();
  count_saved_activations(false);
  EXPECT_EQ(after.live, 0);
  EXPECT_EQ(after.host, 0);
}

}  // namespace
}  // namespace offload_test
}  // namespace tessera
