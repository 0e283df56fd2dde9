// Gradient compression (src/optim/compression) on 2 ranks over Gloo:
// - bf16/fp16 equal the mean rounded exactly as compressor.cpp specifies; top-k with ratio 1 is
//   the exact mean; top-k's dense start and sparsity warm-up follow their schedule (k and bytes
//   per step) and conserve the sum of gradients;
// - PowerSGD equals PyTorch's powerSGD_hook (golden_compression.py) within float32 rounding;
// - error feedback (PowerSGD, top-k) conserves the sum of gradients over steps, and every rank
//   applies the same update;
// - state() / load_state() resume bit-identically; malformed state is refused by name;
// - bytes sent per step on a GPT-2-small block (printed) match each compressor's formula;
// - on a CUDA device (when there is one) each compressor computes what it does on the CPU.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "dist_test.h"
#include "optim/compression/compressor.h"
#include "optim/compression/powersgd.h"
#include "optim/compression/topk.h"
#include "test_util.h"

namespace {

using tessera::GradientCompressor;
using tessera::ParallelOptions;
using tessera::comm::Group;
using tessera::comm::ReduceOp;
using Shapes = std::vector<std::vector<int64_t>>;

// Matrices PowerSGD compresses at rank 2, a vector and a [3, 2] matrix it sends whole.
const Shapes kShapes = {{16, 12}, {6, 4, 3}, {12}, {3, 2}};

// start_step sets both powersgd_start_step and topk_start_step (plain all-reduce steps first).
ParallelOptions compression(const std::string& name, int64_t powersgd_rank = 2, int64_t start_step = 1,
                            double topk_ratio = 0.1, int64_t topk_warmup_steps = 0) {
  ParallelOptions options;
  options.grad_compression = name;
  options.powersgd_rank = powersgd_rank;
  options.powersgd_start_step = start_step;
  options.topk_ratio = topk_ratio;
  options.topk_start_step = start_step;
  options.topk_warmup_steps = topk_warmup_steps;
  return options;
}

// Rank `rank`'s gradients at `step`: seeded normal values, the same in every process.
std::vector<at::Tensor> rank_grads(const Shapes& shapes, int64_t step, int64_t rank) {
  std::vector<at::Tensor> grads;
  for (size_t i = 0; i < shapes.size(); ++i) {
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(1000 * step + 100 * rank + i + 1);
    grads.push_back(at::randn(shapes[i], gen));
  }
  return grads;
}

std::vector<at::Tensor> mean_grads(const Shapes& shapes, int64_t step, int64_t world) {
  std::vector<at::Tensor> mean;
  for (const auto& shape : shapes) mean.push_back(at::zeros(shape));
  for (int64_t r = 0; r < world; ++r) {
    auto grads = rank_grads(shapes, step, r);
    for (size_t i = 0; i < shapes.size(); ++i) mean[i] += grads[i];
  }
  for (auto& m : mean) m /= static_cast<double>(world);
  return mean;
}

std::map<std::string, at::Tensor> copied_state(const GradientCompressor& compressor) {
  std::map<std::string, at::Tensor> out;
  for (const auto& [name, tensor] : compressor.state()) out[name] = tensor.clone();
  return out;
}

// Splits a flat [sum numel] tensor into tensors of `shapes`.
std::vector<at::Tensor> split(const at::Tensor& flat, const Shapes& shapes) {
  std::vector<at::Tensor> out;
  int64_t offset = 0;
  for (const auto& shape : shapes) {
    const int64_t n = c10::multiply_integers(shape);
    out.push_back(flat.narrow(0, offset, n).view(shape));
    offset += n;
  }
  return out;
}

TEST(Compression, FactoryAndTopKCount) {
  EXPECT_EQ(tessera::make_compressor(compression("none")), nullptr);
  EXPECT_NE(tessera::make_compressor(compression("bf16")), nullptr);
  EXPECT_NE(tessera::make_compressor(compression("fp16")), nullptr);
  EXPECT_NE(dynamic_cast<tessera::PowerSGD*>(tessera::make_compressor(compression("powersgd")).get()), nullptr);
  EXPECT_NE(dynamic_cast<tessera::TopK*>(tessera::make_compressor(compression("topk")).get()), nullptr);
  EXPECT_TRUE(tessera::test::throws_naming([] { tessera::make_compressor(compression("gzip")); },
                                           {"parallel.grad_compression", "gzip"}));
  EXPECT_EQ(tessera::TopK(0.01, 0, 0).count(150, 0), 2);  // ceil(1.5)
  EXPECT_EQ(tessera::TopK(0.01, 0, 0).count(1, 0), 1);
  EXPECT_EQ(tessera::TopK(0.25, 0, 0).count(8, 0), 2);
  EXPECT_EQ(tessera::TopK(1.0, 0, 0).count(7, 0), 7);
  // Start 2, warm-up 3: dense, dense, then ratio^(1/4), ratio^(2/4), ratio^(3/4), ratio from then on.
  const tessera::TopK warm(0.01, 2, 3);
  EXPECT_EQ(warm.ratio_at(0), 1.0);
  EXPECT_EQ(warm.ratio_at(1), 1.0);
  EXPECT_EQ(warm.count(150, 1), 150);
  EXPECT_DOUBLE_EQ(warm.ratio_at(2), std::pow(0.01, 0.25));
  EXPECT_DOUBLE_EQ(warm.ratio_at(3), 0.1);
  EXPECT_DOUBLE_EQ(warm.ratio_at(4), std::pow(0.01, 0.75));
  EXPECT_EQ(warm.ratio_at(5), 0.01);
  EXPECT_EQ(warm.ratio_at(1000), 0.01);
  EXPECT_EQ(warm.count(150, 5), 2);
  EXPECT_TRUE(tessera::test::throws_naming([] { tessera::TopK(0.01, -1, 0); }, {"parallel.topk_start_step", "-1"}));
  EXPECT_TRUE(tessera::test::throws_naming([] { tessera::TopK(0.01, 0, -2); }, {"parallel.topk_warmup_steps", "-2"}));
}

TEST(Compression, LoadStateRefusesMalformedStateByName) {
  Group solo("solo", {0}, 0, nullptr, std::chrono::milliseconds(1000));
  auto bf16 = tessera::make_compressor(compression("bf16"));
  EXPECT_TRUE(bf16->state().empty());
  EXPECT_TRUE(tessera::test::throws_naming([&] { bf16->load_state({{"topk.bucket0.residual", at::zeros({4})}}, "ck"); },
                                           {"ck", "topk.bucket0.residual"}));

  auto powersgd = tessera::make_compressor(compression("powersgd", 2, 0));
  const at::Tensor step = at::scalar_tensor(3, at::kLong);
  EXPECT_TRUE(tessera::test::throws_naming(
      [&] { powersgd->load_state({{"topk.bucket0.residual", at::zeros({4})}}, "ck"); }, {"ck", "topk.bucket0"}));
  EXPECT_TRUE(tessera::test::throws_naming(
      [&] { powersgd->load_state({{"powersgd.bucket0.momentum", step}}, "ck"); }, {"ck", "powersgd.bucket0.momentum"}));
  EXPECT_TRUE(tessera::test::throws_naming(
      [&] { powersgd->load_state({{"powersgd.bucket1.q", at::zeros({4})}, {"powersgd.bucket1.step", step}}, "ck"); },
      {"ck", "powersgd.bucket1.residual", "missing"}));
  EXPECT_TRUE(tessera::test::throws_naming(
      [&] { powersgd->load_state({{"powersgd.bucket1.residual", at::zeros({4})}}, "ck"); },
      {"ck", "powersgd.bucket1.step", "missing"}));
  EXPECT_TRUE(tessera::test::throws_naming(
      [&] { powersgd->load_state({{"powersgd.bucket1.step", at::scalar_tensor(1.5)}}, "ck"); },
      {"ck", "powersgd.bucket1.step", "integer"}));

  // Sizes are checked when the bucket is next reduced: this bucket has 192 + 72 + 12 + 6 elements.
  powersgd->load_state({{"powersgd.bucket2.step", step},
                        {"powersgd.bucket2.residual", at::zeros({100})},
                        {"powersgd.bucket2.q", at::zeros({(12 + 12) * 2})}},
                       "ck.safetensors");
  auto grads = rank_grads(kShapes, 0, 0);
  EXPECT_TRUE(tessera::test::throws_naming([&] { powersgd->all_reduce_mean(grads, 2, solo); },
                                           {"ck.safetensors", "powersgd.bucket2.residual", "100", "282"}));
  auto topk = tessera::make_compressor(compression("topk"));
  EXPECT_TRUE(tessera::test::throws_naming(
      [&] { topk->load_state({{"topk.bucket4.residual", at::zeros({5})}}, "ck"); }, {"ck", "topk.bucket4.step", "missing"}));
  EXPECT_TRUE(tessera::test::throws_naming(
      [&] { topk->load_state({{"topk.bucket4.step", at::scalar_tensor(-1, at::kLong)}}, "ck"); },
      {"ck", "topk.bucket4.step", "non-negative integer"}));
  topk->load_state({{"topk.bucket4.step", step}, {"topk.bucket4.residual", at::zeros({5})}}, "ck.safetensors");
  EXPECT_TRUE(tessera::test::throws_naming([&] { topk->all_reduce_mean(grads, 4, solo); },
                                           {"ck.safetensors", "topk.bucket4.residual", "5", "282"}));
}

// On a CUDA device (skipped without one) every compressor computes what it computes on the CPU,
// on a one-member group (its collectives are the identity, so no backend is involved).
TEST(CompressionCuda, MatchesCpuOnOneRank) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  Group solo("solo", {0}, 0, nullptr, std::chrono::milliseconds(1000));
  for (const char* name : {"bf16", "fp16", "powersgd", "topk"}) {
    auto cpu = tessera::make_compressor(compression(name));
    auto cuda = tessera::make_compressor(compression(name));
    for (int64_t step = 0; step < 3; ++step) {
      auto on_cpu = rank_grads(kShapes, step, 0);
      std::vector<at::Tensor> on_cuda;
      for (const auto& g : on_cpu) on_cuda.push_back(g.to(at::kCUDA));
      cpu->all_reduce_mean(on_cpu, 0, solo);
      cuda->all_reduce_mean(on_cuda, 0, solo);
      for (size_t i = 0; i < kShapes.size(); ++i)
        EXPECT_TRUE(tessera::test::all_close(on_cuda[i].cpu(), on_cpu[i], 1e-4, 1e-5))
            << name << " step " << step << " tensor " << i;
    }
  }
}

TEST(Compression, Bf16AndFp16RoundTheMeanAsSpecified) {
  tessera::test::Ranks ranks(2);
  if (!ranks.is_worker()) return ranks.expect_success();
  auto mesh = ranks.connect();
  Group& world = mesh->world();
  const Shapes shapes = {{7, 5}, {9}};
  // A value near float16's largest (65504) on both ranks: its sum overflows float16, its mean does not.
  auto with_large = [&](int64_t rank) {
    auto grads = rank_grads(shapes, 0, rank);
    grads[1][0] = 6.0e4;
    return grads;
  };
  const auto a = with_large(0), b = with_large(1);

  auto bf16 = tessera::make_compressor(compression("bf16"));
  auto grads = with_large(world.rank());
  bf16->all_reduce_mean(grads, 0, world);
  for (size_t i = 0; i < shapes.size(); ++i) {
    const at::Tensor sum = (a[i].to(at::kBFloat16).to(at::kFloat) + b[i].to(at::kBFloat16).to(at::kFloat))
                               .to(at::kBFloat16)
                               .to(at::kFloat);
    EXPECT_TRUE(at::equal(grads[i], sum / 2)) << "bf16 tensor " << i;
  }

  auto fp16 = tessera::make_compressor(compression("fp16"));
  grads = with_large(world.rank());
  fp16->all_reduce_mean(grads, 0, world);
  for (size_t i = 0; i < shapes.size(); ++i) {
    const at::Tensor sum = ((a[i] / 2).to(at::kHalf).to(at::kFloat) + (b[i] / 2).to(at::kHalf).to(at::kFloat))
                               .to(at::kHalf)
                               .to(at::kFloat);
    EXPECT_TRUE(at::equal(grads[i], sum)) << "fp16 tensor " << i;
  }
  EXPECT_EQ(grads[1][0].item<float>(), 6.0e4f);
}

TEST(Compression, TopKWithRatioOneIsTheExactMean) {
  tessera::test::Ranks ranks(2);
  if (!ranks.is_worker()) return ranks.expect_success();
  auto mesh = ranks.connect();
  Group& world = mesh->world();
  auto topk = tessera::make_compressor(compression("topk", 2, 1, 1.0));
  for (int64_t step = 0; step < 2; ++step) {
    auto grads = rank_grads(kShapes, step, world.rank());
    topk->all_reduce_mean(grads, 0, world);
    const auto mean = mean_grads(kShapes, step, 2);
    for (size_t i = 0; i < kShapes.size(); ++i) EXPECT_TRUE(at::equal(grads[i], mean[i])) << "tensor " << i;
  }
  const auto state = copied_state(*topk);
  EXPECT_TRUE(at::equal(state.at("topk.bucket0.residual"), at::zeros({282})));
}

// Top-k sends each rank's k largest |gradient| entries, nothing else: on its first sparse step
// (start 0, ratio 0.1, k = ceil(282 * 0.1) = 29 of the bucket's 282) the result is the mean of the
// two ranks' gradients each kept at its own 29 largest magnitudes, written out here with
// torch's topk, and each rank's residual is the rest of its own gradient.
TEST(Compression, TopKSendsTheKLargestEntries) {
  tessera::test::Ranks ranks(2);
  if (!ranks.is_worker()) return ranks.expect_success();
  auto mesh = ranks.connect();
  Group& world = mesh->world();
  auto topk = tessera::make_compressor(compression("topk", 2, 0, 0.1));
  auto grads = rank_grads(kShapes, 0, world.rank());
  topk->all_reduce_mean(grads, 0, world);
  auto kept = [](int64_t rank) {
    std::vector<at::Tensor> flat;
    for (const auto& g : rank_grads(kShapes, 0, rank)) flat.push_back(g.reshape(-1));
    const at::Tensor whole = at::cat(flat);
    const at::Tensor index = std::get<1>(whole.abs().topk(29));
    return at::zeros_like(whole).index_put_({index}, whole.index({index}));
  };
  const at::Tensor expected = (kept(0) + kept(1)) / 2;
  std::vector<at::Tensor> flat;
  for (const auto& g : grads) flat.push_back(g.reshape(-1));
  EXPECT_TRUE(tessera::test::all_close(at::cat(flat), expected, 1e-6, 1e-7));
  EXPECT_EQ(at::cat(flat).ne(0).sum().item<int64_t>(), expected.ne(0).sum().item<int64_t>());
  std::vector<at::Tensor> mine;
  for (const auto& g : rank_grads(kShapes, 0, world.rank())) mine.push_back(g.reshape(-1));
  const at::Tensor own = at::cat(mine);
  EXPECT_TRUE(tessera::test::all_close(copied_state(*topk).at("topk.bucket0.residual"), own - kept(world.rank()), 0, 0));
}

// Start 1, warm-up 3, ratio 0.1 on 282 elements over 2 ranks: step 0 is a plain all-reduce (the
// exact mean, no residual yet); step 1 (ratio 0.1^(1/4), k = 159, 2k >= 282) an all-reduce of
// gradient + residual; steps 2, 3 top-k with k = ceil(282 * 0.1^(2/4)) = 90 and
// ceil(282 * 0.1^(3/4)) = 51; then k = 29. Bytes per step follow; the sum of gradients is conserved
// through the whole schedule.
TEST(Compression, TopKWarmUpIsDenseThenSparsifiesGeometrically) {
  tessera::test::Ranks ranks(2);
  if (!ranks.is_worker()) return ranks.expect_success();
  auto mesh = ranks.connect();
  Group& world = mesh->world();
  auto topk = tessera::make_compressor(compression("topk", 2, 1, 0.1, 3));
  const int64_t numel = 282, all_reduce_bytes = 2 * (world.size() - 1) * 4 * numel / world.size();
  const std::vector<int64_t> k = {0, 0, 90, 51, 29, 29, 29};  // 0: an all-reduce
  std::vector<at::Tensor> applied, truth;
  for (const auto& shape : kShapes) {
    applied.push_back(at::zeros(shape));
    truth.push_back(at::zeros(shape));
  }
  for (int64_t step = 0; step < static_cast<int64_t>(k.size()); ++step) {
    auto grads = rank_grads(kShapes, step, world.rank());
    world.reset_traffic();
    topk->all_reduce_mean(grads, 0, world);
    EXPECT_EQ(world.bytes_sent(), k[step] == 0 ? all_reduce_bytes : (world.size() - 1) * 8 * k[step]) << step;
    const auto mean = mean_grads(kShapes, step, world.size());
    for (size_t i = 0; i < kShapes.size(); ++i) {
      if (step == 0) {
        EXPECT_TRUE(at::equal(grads[i], mean[i])) << "tensor " << i;
      }
      applied[i] += grads[i];
      truth[i] += mean[i];
    }
    const auto state = copied_state(*topk);
    EXPECT_EQ(state.at("topk.bucket0.step").item<int64_t>(), step + 1);
    EXPECT_EQ(state.count("topk.bucket0.residual"), step == 0 ? 0u : 1u) << step;
    if (step == 1) {
      EXPECT_TRUE(at::equal(state.at("topk.bucket0.residual"), at::zeros({numel})));
    }
  }
  at::Tensor residual = copied_state(*topk).at("topk.bucket0.residual");
  EXPECT_GT(residual.abs().max().item<double>(), 0.1);  // the sparse steps left something behind
  world.all_reduce(residual, ReduceOp::avg);
  const auto mean_residual = split(residual, kShapes);
  for (size_t i = 0; i < kShapes.size(); ++i)
    EXPECT_TRUE(tessera::test::all_close(applied[i] + mean_residual[i], truth[i], 1e-5, 1e-5)) << "tensor " << i;
}

// Resuming at another number of ranks: residuals are averaged (the mean residual, which the
// error-feedback invariant is about, is kept), tensors equal on every rank are kept as they are.
TEST(Compression, MergeRankStatesKeepsTheMeanResidual) {
  const at::Tensor q = at::randn({6}), step = at::scalar_tensor(7, at::kLong);
  const at::Tensor r0 = at::randn({5}), r1 = at::randn({5});
  using State = std::map<std::string, at::Tensor>;
  const std::vector<State> states{{{"powersgd.bucket0.q", q}, {"powersgd.bucket0.residual", r0}, {"powersgd.bucket0.step", step}},
                                  {{"powersgd.bucket0.q", q.clone()}, {"powersgd.bucket0.residual", r1}, {"powersgd.bucket0.step", step.clone()}}};
  const State merged = tessera::compression::merge_rank_states(states, "ck");
  ASSERT_EQ(merged.size(), 3u);
  EXPECT_TRUE(at::equal(merged.at("powersgd.bucket0.q"), q));
  EXPECT_EQ(merged.at("powersgd.bucket0.step").item<int64_t>(), 7);
  EXPECT_EQ(merged.at("powersgd.bucket0.step").scalar_type(), at::kLong);
  EXPECT_TRUE(tessera::test::all_close(merged.at("powersgd.bucket0.residual"), (r0 + r1) / 2, 1e-6, 1e-7));

  std::vector<State> steps_differ = states;
  steps_differ[1]["powersgd.bucket0.step"] = at::scalar_tensor(8, at::kLong);
  EXPECT_TRUE(tessera::test::throws_naming([&] { tessera::compression::merge_rank_states(steps_differ, "ck"); },
                                           {"ck", "powersgd.bucket0.step", "differs between ranks"}));
  std::vector<State> missing = states;
  missing[1].erase("powersgd.bucket0.q");
  EXPECT_TRUE(tessera::test::throws_naming([&] { tessera::compression::merge_rank_states(missing, "ck"); },
                                           {"ck", "powersgd.bucket0.q", "rank 1"}));
  std::vector<State> extra = states;
  extra[1]["powersgd.bucket1.q"] = q;
  EXPECT_TRUE(tessera::test::throws_naming([&] { tessera::compression::merge_rank_states(extra, "ck"); },
                                           {"ck", "rank 1 saved 4"}));
}

// Over 6 steps: sum of applied + mean residual = sum of true means; the compression is lossy on
// some step (the test could fail); every rank applies the same values.
void expect_error_feedback_conserves(const ParallelOptions& options, Group& world) {
  auto compressor = tessera::make_compressor(options);
  const int64_t steps = 6, bucket = 3;
  std::vector<at::Tensor> applied, truth;
  for (const auto& shape : kShapes) {
    applied.push_back(at::zeros(shape));
    truth.push_back(at::zeros(shape));
  }
  double largest_error = 0;
  for (int64_t step = 0; step < steps; ++step) {
    auto grads = rank_grads(kShapes, step, world.rank());
    compressor->all_reduce_mean(grads, bucket, world);
    const auto mean = mean_grads(kShapes, step, world.size());
    for (size_t i = 0; i < kShapes.size(); ++i) {
      applied[i] += grads[i];
      truth[i] += mean[i];
      largest_error = std::max(largest_error, (grads[i] - mean[i]).abs().max().item<double>());
      at::Tensor first = grads[i].clone();
      world.broadcast(first, 0);
      EXPECT_TRUE(at::equal(first, grads[i])) << options.grad_compression << " step " << step << " tensor " << i;
    }
  }
  EXPECT_GT(largest_error, 0.1) << options.grad_compression << " never approximated";
  const auto state = copied_state(*compressor);
  at::Tensor residual = state.at(tessera::compression::state_name(options.grad_compression, bucket, "residual"));
  world.all_reduce(residual, ReduceOp::avg);
  const auto mean_residual = split(residual, kShapes);
  for (size_t i = 0; i < kShapes.size(); ++i)
    EXPECT_TRUE(tessera::test::all_close(applied[i] + mean_residual[i], truth[i], 1e-5, 1e-5))
        << options.grad_compression << " tensor " << i;
}

TEST(Compression, ErrorFeedbackConservesTheSumOfGradients) {
  tessera::test::Ranks ranks(2);
  if (!ranks.is_worker()) return ranks.expect_success();
  auto mesh = ranks.connect();
  expect_error_feedback_conserves(compression("powersgd", 2, 1), mesh->world());
  expect_error_feedback_conserves(compression("topk", 2, 1, 0.1), mesh->world());
}

// The golden is torch's powerSGD_hook on the ranks' mean gradients (golden_compression.py says why
// that equals a 2-rank step). The tolerance covers float32 rounding of M Q summed in another order
// and carried through QR; the Qs are compared too, so the first Q (seeded randn) is checked as well.
TEST(Compression, PowerSGDMatchesTorchHook) {
  tessera::test::Ranks ranks(2);
  if (!ranks.is_worker()) return ranks.expect_success();
  auto mesh = ranks.connect();
  Group& world = mesh->world();
  const auto file = tessera::test::golden("compression_powersgd.safetensors");
  const auto meta = [&](const char* key) { return std::stoll(file.metadata.at(key)); };
  ASSERT_EQ(meta("world"), world.size());
  const int64_t steps = meta("steps"), bucket = meta("bucket");
  const std::vector<std::string> names = {"w", "t", "b", "s", "u"};
  auto powersgd = tessera::make_compressor(compression("powersgd", meta("rank"), meta("start_step")));
  const double rtol = 1e-5, atol = 1e-5;  // measured: at most 2.2e-6 off
  for (int64_t k = 0; k < steps; ++k) {
    const std::string step = "s" + std::to_string(k) + ".";
    std::vector<at::Tensor> grads;
    for (const auto& n : names)
      grads.push_back(file.tensors.at("grad." + step + "r" + std::to_string(world.rank()) + "." + n).clone());
    powersgd->all_reduce_mean(grads, bucket, world);
    for (size_t i = 0; i < names.size(); ++i)
      EXPECT_TRUE(tessera::test::all_close(grads[i], file.tensors.at("applied." + step + names[i]), rtol, atol))
          << "step " << k << " " << names[i];
  }
  const auto state = copied_state(*powersgd);
  EXPECT_EQ(state.at("powersgd.bucket5.step").item<int64_t>(), steps);
  at::Tensor residual = state.at("powersgd.bucket5.residual");
  world.all_reduce(residual, ReduceOp::avg);
  EXPECT_TRUE(tessera::test::all_close(residual, file.tensors.at("residual"), rtol, atol));
  EXPECT_TRUE(tessera::test::all_close(state.at("powersgd.bucket5.q"), file.tensors.at("q"), rtol, atol));
}

// A compressor rebuilt from a copy of another's state computes the same next step, bit for bit.
TEST(Compression, StateRoundTripsThroughLoadState) {
  tessera::test::Ranks ranks(2);
  if (!ranks.is_worker()) return ranks.expect_success();
  auto mesh = ranks.connect();
  Group& world = mesh->world();
  // Top-k's step 3 is inside its warm-up (k depends on the step count, which must come back).
  for (const auto& options : {compression("powersgd", 2, 1), compression("topk", 2, 1, 0.1, 3)}) {
    auto original = tessera::make_compressor(options);
    for (int64_t step = 0; step < 3; ++step) {
      for (int64_t bucket : {0, 1}) {
        auto grads = rank_grads(kShapes, 10 * bucket + step, world.rank());
        original->all_reduce_mean(grads, bucket, world);
      }
    }
    auto resumed = tessera::make_compressor(options);
    resumed->load_state(copied_state(*original), "checkpoint");
    for (int64_t bucket : {0, 1}) {
      auto a = rank_grads(kShapes, 10 * bucket + 3, world.rank());
      auto b = rank_grads(kShapes, 10 * bucket + 3, world.rank());
      original->all_reduce_mean(a, bucket, world);
      resumed->all_reduce_mean(b, bucket, world);
      for (size_t i = 0; i < kShapes.size(); ++i) EXPECT_TRUE(at::equal(a[i], b[i])) << options.grad_compression;
    }
    const auto x = copied_state(*original), y = copied_state(*resumed);
    ASSERT_EQ(x.size(), y.size());
    for (const auto& [name, tensor] : x) EXPECT_TRUE(at::equal(tensor, y.at(name))) << name;
  }
}

// One GPT-2-small block (C = 768, MLP 4C) as one bucket: bytes sent per rank per step against an
// uncompressed float32 all-reduce, each checked against its formula and printed.
TEST(Compression, BytesPerStepOnAGptBlock) {
  tessera::test::Ranks ranks(2);
  if (!ranks.is_worker()) return ranks.expect_success();
  auto mesh = ranks.connect();
  Group& world = mesh->world();
  const int64_t c = 768, n = world.size();
  const Shapes block = {{c}, {c}, {3 * c, c}, {3 * c}, {c, c}, {c}, {c}, {c}, {4 * c, c}, {4 * c}, {c, 4 * c}, {c}};
  int64_t numel = 0;
  for (const auto& shape : block) numel += c10::multiply_integers(shape);

  auto bytes_of = [&](GradientCompressor* compressor) {
    auto grads = rank_grads(block, 0, world.rank());
    world.reset_traffic();
    if (compressor)
      compressor->all_reduce_mean(grads, 0, world);
    else
      world.all_reduce(grads, ReduceOp::avg);
    return world.bytes_sent();
  };
  // PowerSGD at rank r: the vectors whole, then P [n, r] and Q [m, r] of each matrix.
  auto powersgd_elements = [&](int64_t r) {
    int64_t elements = 0;
    for (const auto& shape : block)
      elements += shape.size() < 2 ? shape[0] : r * (shape[0] + shape[1]);
    return elements;
  };
  const int64_t none = bytes_of(nullptr);
  EXPECT_EQ(none, 2 * (n - 1) * 4 * numel / n);

  struct Row {
    std::string label;
    ParallelOptions options;
    int64_t expected;
  };
  const tessera::TopK topk_1(0.01, 0, 0), topk_01(0.001, 0, 0);
  const std::vector<Row> rows = {
      {"bf16", compression("bf16"), none / 2},
      {"fp16", compression("fp16"), none / 2},
      {"powersgd rank 1", compression("powersgd", 1, 0), 2 * (n - 1) * 4 * powersgd_elements(1) / n},
      {"powersgd rank 4", compression("powersgd", 4, 0), 2 * (n - 1) * 4 * powersgd_elements(4) / n},
      {"powersgd rank 16", compression("powersgd", 16, 0), 2 * (n - 1) * 4 * powersgd_elements(16) / n},
      {"topk 0.01", compression("topk", 4, 0, 0.01), (n - 1) * 8 * topk_1.count(numel, 0)},
      {"topk 0.001", compression("topk", 4, 0, 0.001), (n - 1) * 8 * topk_01.count(numel, 0)},
  };
  if (world.rank() == 0)
    std::printf("GPT-2-small block, %lld parameters, %lld ranks: bytes sent per rank per step\n",
                static_cast<long long>(numel), static_cast<long long>(n));
  if (world.rank() == 0) std::printf("  %-18s %12lld  1\n", "none (float32)", static_cast<long long>(none));
  for (const Row& row : rows) {
    auto compressor = tessera::make_compressor(row.options);
    const int64_t bytes = bytes_of(compressor.get());
    EXPECT_EQ(bytes, row.expected) << row.label;
    if (world.rank() == 0)
      std::printf("  %-18s %12lld  1/%.1f\n", row.label.c_str(), static_cast<long long>(bytes),
                  static_cast<double>(none) / static_cast<double>(bytes));
  }
}

}  // namespace
