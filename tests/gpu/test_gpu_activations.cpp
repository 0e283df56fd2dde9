// Saved activations on a CUDA device (memory/activation_codec.h, memory/activation_offload.h):
// the codecs encode on the GPU exactly as the CPU kernels do (the same ATen expression: amax,
// division, rounding half to even), and blocks whose activations are offloaded through pinned host
// memory on the copy streams train as the resident run does: the same losses, gradients within
// 1e-5 (CUDA's embedding backward accumulates with atomics), every group stored and back, nothing
// left on either side after the backward, and the device holding at most two blocks' groups over
// the backward. Skipped without CUDA.
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <chrono>
#include <thread>

#include "memory/activation_codec.h"
#include "memory/activation_offload.h"
#include "memory/saved_activations.h"
#include "model/transformer.h"
#include "unit/model/small_model.h"

namespace tessera {
namespace {

TEST(GpuActivationCodec, EncodesAsTheCpuKernelsDo) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(3);
  at::Tensor x = at::randn({6, 5, 128}, gen) * at::rand({6, 5, 1}, gen) * 10;
  x[2][1].zero_();  // all-zero groups
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16})
    for (ActivationCodec codec : {ActivationCodec::int8, ActivationCodec::fp8, ActivationCodec::bf16}) {
      const at::Tensor in = x.to(dtype);
      const EncodedTensor cpu = encode_activation(in, codec);
      const EncodedTensor gpu = encode_activation(in.cuda(), codec);
      const std::string what = std::string(activation_codec_name(codec)) + (dtype == at::kFloat ? " float32" : " bf16");
      ASSERT_EQ(gpu.form, cpu.form) << what;
      EXPECT_TRUE(gpu.data.is_cuda()) << what << ": encoded off the device";
      EXPECT_TRUE(gpu.data.cpu().view(at::kByte).equal(cpu.data.view(at::kByte))) << what;
      if (cpu.scales.defined()) {
        EXPECT_TRUE(gpu.scales.cpu().equal(cpu.scales)) << what;
      }
      EXPECT_TRUE(decode_activation(gpu).cpu().equal(decode_activation(cpu))) << what;
    }
}

struct Step {
  std::vector<at::Tensor> grads;
  at::Tensor loss;
  SavedActivationBytes bytes;  // over the backward
  ActivationOffloadStats offload;
};

Step step(const ModelOptions& opts, const std::string& codec, int64_t offloaded) {
  const c10::Device cuda(c10::DeviceType::CUDA, 0);
  torch::manual_seed(11);
  TransformerLM m(opts);
  m->to(cuda);
  m->set_activation_compression(codec);
  if (offloaded > 0) m->set_activation_offload(offloaded, std::make_shared<ActivationOffload>(cuda, 0));
  m->train();
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(12);
  const at::Tensor idx = at::randint(opts.vocab_size, {8, 32}, gen, at::kLong).to(cuda);
  const at::Tensor targets = at::randint(opts.vocab_size, {8, 32}, gen, at::kLong).to(cuda);
  count_saved_activations(true);
  reset_activation_offload_stats();
  ModelOutput out = m->forward(idx, targets);
  torch::cuda::synchronize();
  for (int i = 0; i < 10000 && saved_activation_bytes().host < activation_offload_stats().stored_bytes; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  reset_saved_activation_peak();
  Step result;
  result.loss = out.loss.detach().cpu();
  out.loss.backward();
  out = {};
  torch::cuda::synchronize();
  result.bytes = saved_activation_bytes();
  result.offload = activation_offload_stats();
  count_saved_activations(false);
  for (auto& p : m->parameters()) result.grads.push_back(p.grad().cpu());
  return result;
}

TEST(GpuActivationOffload, MatchesResidentAndTheDeviceHoldsLess) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  ModelOptions opts = test::small_model("gpt", "dense", 64, 0.0);
  opts.n_layer = 4;
  for (const std::string codec : {"none", "int8"}) {
    const Step resident = step(opts, codec, 0);
    const Step offloaded = step(opts, codec, opts.n_layer);
    EXPECT_TRUE(offloaded.loss.equal(resident.loss)) << codec;
    ASSERT_EQ(offloaded.grads.size(), resident.grads.size());
    for (size_t i = 0; i < resident.grads.size(); ++i)
      EXPECT_TRUE(offloaded.grads[i].allclose(resident.grads[i], 1e-5, 1e-6)) << codec << ": parameter " << i;
    EXPECT_EQ(offloaded.offload.groups, opts.n_layer) << codec;
    EXPECT_GT(offloaded.bytes.host_peak, 0) << codec;
    EXPECT_EQ(offloaded.bytes.host, 0) << codec << ": host copies left after the backward";
    EXPECT_EQ(offloaded.bytes.live, 0) << codec << ": device copies left after the backward";
    EXPECT_LE(offloaded.bytes.peak, resident.bytes.peak - offloaded.bytes.host_peak / 2 + resident.bytes.peak / 100)
        << codec;
    std::printf("measured: %s: device peak %lld of %lld bytes resident over the backward, host peak %lld, "
                "%lld exposed fetches, %lld kept groups\n",
                codec.c_str(), static_cast<long long>(offloaded.bytes.peak),
                static_cast<long long>(resident.bytes.peak), static_cast<long long>(offloaded.bytes.host_peak),
                static_cast<long long>(offloaded.offload.exposed_fetches),
                static_cast<long long>(offloaded.offload.kept_groups));
  }
}

}  // namespace
}  // namespace tessera
