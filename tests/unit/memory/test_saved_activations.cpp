// Saved-activation encodings (memory/activation_codec.h) and the hooks that apply them to what
// autograd saves (memory/saved_activations.h).
#include <gtest/gtest.h>

#include <torch/nn/modules/linear.h>
#include <torch/types.h>
#include <torch/utils.h>

#include "core/error.h"
#include "memory/activation_codec.h"
#include "memory/saved_activations.h"

namespace tessera {
namespace {

at::Tensor sample(std::vector<int64_t> sizes, uint64_t seed = 3) {
  at::Generator g = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randn(sizes, g) * at::linspace(0.01, 20, sizes.back());  // magnitudes differ across the last dim
}

TEST(ActivationCodec, Int8IsWithinHalfAStepOfItsGroupsScale) {
  const at::Tensor x = sample({6, 5, 64});
  const EncodedTensor e = encode_activation(x, ActivationCodec::int8);
  ASSERT_EQ(e.form, EncodedTensor::Form::int8);
  EXPECT_EQ(e.bytes(), x.numel() + x.numel() / kActivationGroup * 4);  // int8 values and a float32 scale per 32
  const at::Tensor back = decode_activation(e);
  ASSERT_EQ(back.sizes(), x.sizes());
  ASSERT_EQ(back.scalar_type(), x.scalar_type());
  const at::Tensor groups = x.reshape({-1, kActivationGroup});
  const at::Tensor step = groups.abs().amax({1}, true) / 127;
  const at::Tensor error = (back.reshape({-1, kActivationGroup}) - groups).abs();
  EXPECT_TRUE((error <= step * 0.5001).all().item<bool>()) << (error / step).max().item<double>();
  EXPECT_GT(error.max().item<double>(), 0);  // it is lossy
}

// int4: half a step of amax / 7, two codes to a byte (element 2 i low, 2 i + 1 high, each plus 8),
// also for an odd count (the last byte's high half is padding) and a group that is a whole last
// dimension not a multiple of 32.
TEST(ActivationCodec, Int4IsWithinHalfAStepAndPacksTwoCodesToAByte) {
  for (const std::vector<int64_t>& sizes : {std::vector<int64_t>{6, 5, 64}, std::vector<int64_t>{3, 9}}) {
    const at::Tensor x = sample(sizes);
    const int64_t n = x.numel(), group = sizes.back() % kActivationGroup == 0 ? kActivationGroup : sizes.back();
    const EncodedTensor e = encode_activation(x, ActivationCodec::int4);
    ASSERT_EQ(e.form, EncodedTensor::Form::int4);
    EXPECT_EQ(e.bytes(), (n + 1) / 2 + n / group * 4);
    const at::Tensor groups = x.reshape({-1, group});
    const at::Tensor scale = groups.abs().amax({1}, true) / 7;
    EXPECT_TRUE(e.scales.equal(scale));
    const at::Tensor codes = (groups / scale).round().clamp(-7, 7).to(at::kInt).reshape({-1});
    const at::Tensor bytes = e.data.to(at::kInt);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t stored = i % 2 == 0 ? bytes[i / 2].item<int64_t>() & 15 : bytes[i / 2].item<int64_t>() >> 4;
      ASSERT_EQ(stored, codes[i].item<int64_t>() + 8) << "element " << i << " of " << x.sizes();
    }
    if (n % 2 != 0) {
      EXPECT_EQ(bytes[n / 2].item<int64_t>() >> 4, 8);
    }
    const at::Tensor back = decode_activation(e);
    ASSERT_EQ(back.sizes(), x.sizes());
    EXPECT_TRUE(back.equal((codes.to(at::kFloat).view({-1, group}) * scale).view(x.sizes())));
    const at::Tensor error = (back.reshape({-1, group}) - groups).abs();
    EXPECT_TRUE((error <= scale * 0.5001).all().item<bool>()) << (error / scale).max().item<double>();
  }
}

// The CPU kernels compute what activation_codec.h states, in the ATen expression other devices
// run: scale = amax / top (1 for an all-zero group), x / scale rounded half to even and clamped
// (int8) or cast (fp8); decoding q * scale. Equal bit for bit, float32 and bfloat16 inputs.
TEST(ActivationCodec, TheCpuKernelsEncodeAsTheStatedFormulaDoes) {
  at::Tensor x = sample({5, 3, 96});
  x[1][2].zero_();  // all-zero groups
  // A group whose scale is exactly 1 (largest magnitude 127) and whose values are halves: every
  // one a tie, which rounds to the even neighbour (2.5 -> 2, 3.5 -> 4).
  x[0][0].narrow(0, 0, kActivationGroup).copy_(at::arange(-15.5, 16.0, 1.0));
  x[0][0][31] = 127;
  const EncodedTensor ties = encode_activation(x, ActivationCodec::int8);
  EXPECT_EQ(ties.data[0][18].item<int>(), 2);  // 2.5
  EXPECT_EQ(ties.data[0][19].item<int>(), 4);  // 3.5
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    const at::Tensor in = x.to(dtype);
    const at::Tensor g = in.to(at::kFloat).reshape({-1, kActivationGroup});
    const at::Tensor amax = g.abs().amax({1}, true);
    for (ActivationCodec codec : {ActivationCodec::int8, ActivationCodec::fp8}) {
      const bool fp8 = codec == ActivationCodec::fp8;
      const at::Tensor scale = at::where(amax > 0, amax / (fp8 ? 448.0 : 127.0), at::ones_like(amax));
      const at::Tensor q = fp8 ? (g / scale).to(at::kFloat8_e4m3fn) : (g / scale).round().clamp(-127, 127).to(at::kChar);
      const EncodedTensor e = encode_activation(in, codec);
      EXPECT_TRUE(e.scales.equal(scale)) << activation_codec_name(codec);
      EXPECT_TRUE(e.data.view(at::kByte).equal(q.view(at::kByte))) << activation_codec_name(codec);
      const at::Tensor back = (q.to(at::kFloat) * scale).to(dtype).view(x.sizes());
      EXPECT_TRUE(decode_activation(e).equal(back)) << activation_codec_name(codec);
    }
  }
}

TEST(ActivationCodec, Fp8AndBf16KeepTheirRelativePrecision) {
  const at::Tensor x = sample({4, 96});
  const at::Tensor fp8 = decode_activation(encode_activation(x, ActivationCodec::fp8));
  // e4m3: 3 mantissa bits, so a value in the normal range is within 2^-4 of itself; the group's
  // scale puts the largest at 448 and values below 2^-6 of it among the subnormals (absolute 2^-9).
  const at::Tensor amax = x.reshape({-1, kActivationGroup}).abs().amax({1}, true) / 448;
  const at::Tensor bound = (x.reshape({-1, kActivationGroup}).abs() * 0.0625 + amax * 0.002).reshape(x.sizes());
  EXPECT_TRUE(((fp8 - x).abs() <= bound).all().item<bool>());
  const at::Tensor bf16 = decode_activation(encode_activation(x, ActivationCodec::bf16));
  EXPECT_TRUE(((bf16 - x).abs() <= x.abs() * (1.0 / 256)).all().item<bool>());
  EXPECT_EQ(encode_activation(x, ActivationCodec::bf16).bytes(), x.numel() * 2);
  // Already 16-bit: bf16 keeps it.
  EXPECT_EQ(encode_activation(x.to(at::kBFloat16), ActivationCodec::bf16).form, EncodedTensor::Form::kept);
}

TEST(ActivationCodec, BoolMasksAreBitsAndComeBackExactly) {
  at::Generator g = at::make_generator<at::CPUGeneratorImpl>(5);
  const at::Tensor mask = at::rand({3, 7, 13}, g) > 0.5;  // 273 elements: not a multiple of 8
  for (ActivationCodec codec : {ActivationCodec::lossless, ActivationCodec::int8}) {
    const EncodedTensor e = encode_activation(mask, codec);
    ASSERT_EQ(e.form, EncodedTensor::Form::bits);
    EXPECT_EQ(e.bytes(), (273 + 7) / 8);
    EXPECT_TRUE(decode_activation(e).equal(mask));
  }
  EXPECT_EQ(encode_activation(mask, ActivationCodec::none).form, EncodedTensor::Form::kept);
}

// What makes the harness's rows comparable: a group depends only on its own values, so a tensor
// split along an outer dimension, or along the last at a multiple of 32, encodes the same.
TEST(ActivationCodec, SplittingATensorAsALayoutDoesEncodesEachElementTheSame) {
  const at::Tensor x = sample({4, 8, 128});
  for (ActivationCodec codec : {ActivationCodec::fp8, ActivationCodec::int8, ActivationCodec::int4}) {
    const at::Tensor whole = decode_activation(encode_activation(x, codec));
    for (int64_t dim : {0, 1, 2}) {
      std::vector<at::Tensor> parts;
      for (const at::Tensor& part : x.chunk(2, dim)) parts.push_back(decode_activation(encode_activation(part, codec)));
      EXPECT_TRUE(at::cat(parts, dim).equal(whole)) << activation_codec_name(codec) << " split along " << dim;
    }
  }
}

TEST(ActivationCodec, NarrowAndIntegerTensorsAreKept) {
  EXPECT_EQ(encode_activation(sample({4096, 1}), ActivationCodec::int8).form, EncodedTensor::Form::kept);  // last dim 1
  EXPECT_EQ(encode_activation(sample({64, 4}), ActivationCodec::fp8).form, EncodedTensor::Form::kept);
  EXPECT_EQ(encode_activation(at::arange(8192), ActivationCodec::int8).form, EncodedTensor::Form::kept);
  EXPECT_THROW(parse_activation_codec("int2"), Error);
  try {
    parse_activation_codec("int2");
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("memory.activation_compression"), std::string::npos) << e.what();
  }
}

// A module whose forward saves: its input (activation, by the first product), the weights, the
// GELU's input, a bool mask (where) and one tensor twice (y * y).
struct Net : torch::nn::Module {
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  Net() {
    torch::manual_seed(1);
    fc1 = register_module("fc1", torch::nn::Linear(64, 128));
    fc2 = register_module("fc2", torch::nn::Linear(128, 64));
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = torch::gelu(fc1(x));
    at::Tensor gated = at::where(h > 0.1, h, h * 0.5);
    at::Tensor y = fc2(gated);
    return y * y;
  }
};

struct Gradients {
  at::Tensor input;
  std::vector<at::Tensor> params;
};

Gradients run(Net& net, ActivationCodec codec, SavedActivationBytes* after_forward = nullptr) {
  net.zero_grad();
  const at::Tensor x = sample({8, 16, 64}, 9).requires_grad_(true);
  at::Tensor loss;
  {
    SavedActivationScope scope(codec, net);
    loss = net.forward(x).sum();
  }
  if (after_forward) *after_forward = saved_activation_bytes();
  loss.backward();
  Gradients g{x.grad().clone(), {}};
  for (const auto& p : net.parameters()) g.params.push_back(p.grad().clone());
  return g;
}

TEST(SavedActivations, LosslessGivesBitIdenticalGradientsAndPacksMasks) {
  Net net;
  const Gradients plain = run(net, ActivationCodec::none);
  count_saved_activations(true);
  SavedActivationBytes none_bytes, lossless_bytes;
  const Gradients counted = run(net, ActivationCodec::none, &none_bytes);
  const Gradients lossless = run(net, ActivationCodec::lossless, &lossless_bytes);
  count_saved_activations(false);
  EXPECT_TRUE(counted.input.equal(plain.input));
  EXPECT_TRUE(lossless.input.equal(plain.input));
  for (size_t i = 0; i < plain.params.size(); ++i) {
    EXPECT_TRUE(counted.params[i].equal(plain.params[i])) << i;
    EXPECT_TRUE(lossless.params[i].equal(plain.params[i])) << i;
  }
  // The mask of `where` (8 x 16 x 128 bools) shrinks eightfold; nothing else changes.
  const int64_t mask = 8 * 16 * 128;
  EXPECT_EQ(none_bytes.live - lossless_bytes.live, mask - mask / 8);
  EXPECT_EQ(saved_activation_bytes().live, 0) << "the backward freed every saved tensor";
}

TEST(SavedActivations, Int8EncodesActivationsOnceAndKeepsTheWeights) {
  Net net;
  const Gradients plain = run(net, ActivationCodec::none);
  count_saved_activations(true);
  SavedActivationBytes none_bytes, int8_bytes;
  run(net, ActivationCodec::none, &none_bytes);
  const Gradients int8 = run(net, ActivationCodec::int8, &int8_bytes);
  count_saved_activations(false);
  // Saved: x [8,16,64] (fc1's product), fc1's output (GELU's input) [8,16,128], where's mask,
  // where's output (fc2's input) [8,16,128], y [8,16,64] once though y * y saves it twice. The
  // weights are not counted: they are not activations.
  const int64_t tokens = 8 * 16, mask = tokens * 128;
  const int64_t floats = tokens * (64 + 128 + 128 + 64);
  EXPECT_EQ(none_bytes.live, floats * 4 + mask);
  EXPECT_EQ(int8_bytes.live, floats + floats / kActivationGroup * 4 + mask / 8);
  // Lossy, so the gradients move, by about the int8 step.
  EXPECT_FALSE(int8.input.equal(plain.input));
  EXPECT_TRUE(int8.input.allclose(plain.input, 0.05, 0.05 * plain.input.abs().max().item<double>()));
  for (size_t i = 0; i < plain.params.size(); ++i)
    EXPECT_TRUE(int8.params[i].allclose(plain.params[i], 0.05, 0.05 * plain.params[i].abs().max().item<double>()))
        << i;
  EXPECT_EQ(saved_activation_bytes().live, 0);
}

TEST(SavedActivations, Int4HoldsHalfAByteAnElementAndMovesTheGradientsByItsStep) {
  Net net;
  const Gradients plain = run(net, ActivationCodec::none);
  count_saved_activations(true);
  SavedActivationBytes int4_bytes;
  const Gradients int4 = run(net, ActivationCodec::int4, &int4_bytes);
  count_saved_activations(false);
  const int64_t tokens = 8 * 16, mask = tokens * 128, floats = tokens * (64 + 128 + 128 + 64);
  EXPECT_EQ(int4_bytes.live, floats / 2 + floats / kActivationGroup * 4 + mask / 8);
  // A 4-bit step is 1/7 of a group's largest magnitude: the gradients move by a few percent.
  EXPECT_FALSE(int4.input.equal(plain.input));
  EXPECT_TRUE(int4.input.allclose(plain.input, 0.3, 0.3 * plain.input.abs().max().item<double>()));
  for (size_t i = 0; i < plain.params.size(); ++i)
    EXPECT_TRUE(int4.params[i].allclose(plain.params[i], 0.3, 0.3 * plain.params[i].abs().max().item<double>())) << i;
  EXPECT_EQ(saved_activation_bytes().live, 0);
}

TEST(SavedActivations, NothingIsPackedOutsideAScopeOrWithoutGradients) {
  Net net;
  count_saved_activations(true);
  reset_saved_activation_peak();
  const at::Tensor x = sample({8, 16, 64}, 9).requires_grad_(true);
  at::Tensor loss = net.forward(x).sum();  // no scope
  EXPECT_EQ(saved_activation_bytes().live, 0);
  loss.backward();
  {
    torch::NoGradGuard no_grad;
    SavedActivationScope scope(ActivationCodec::int8, net);
    net.forward(x);
  }
  EXPECT_EQ(saved_activation_bytes().peak, 0);
  count_saved_activations(false);
}

}  // namespace
}  // namespace tessera
