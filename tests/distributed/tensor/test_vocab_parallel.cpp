// Vocabulary-parallel embedding and cross-entropy (parallel/tensor/vocab_parallel.h) at N = 2 and
// 4 ranks against the single-device formulas (tolerance 1e-6 on losses and gradients):
// - cross-entropy of rank r's columns of random logits (some targets ignored) equals
//   at::cross_entropy on the full logits, on every rank, and its gradient equals columns
//   [r V/N, (r+1) V/N) of the full gradient; the same for bf16 logits (1e-2, bf16 rounding);
// - a tied embedding + head (x = wte[idx] + h, logits = x wte^T) with wte split by rows: loss, the
//   gradient of wte's rows and of h equal the single-device ones;
// - the bytes sent: three float32 values per position (max, then the sum of exponentials and the
//   target logit), each all-reduced;
// - a vocabulary not divisible by N is refused naming model.vocab_size and parallel.tp.
#include <ATen/ATen.h>
#include <torch/types.h>
#include <torch/utils.h>

#include "distributed/dist_test.h"
#include "parallel/tensor/tp_comm.h"
#include "parallel/tensor/vocab_parallel.h"
#include "test_util.h"

namespace vocab_parallel_test {  // named: the unity batch holds test_tp_comm.cpp and test_tensor_parallel.cpp too

using tessera::comm::Group;
using tessera::test::all_close;

constexpr int64_t B = 2, T = 8, V = 64, C = 16;

struct Batch {
  at::Tensor logits;   // [B, T, V]
  at::Tensor targets;  // [B, T], a few -1
};

Batch make_batch(uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  at::Tensor logits = 3 * at::randn({B, T, V}, gen);
  at::Tensor targets = at::randint(V, {B, T}, gen);
  targets.index_put_({0, 1}, -1);
  targets.index_put_({1, 5}, -1);
  return {logits, targets};
}

at::Tensor reference_loss(const at::Tensor& logits, const at::Tensor& targets) {
  return at::cross_entropy_loss(logits.reshape({-1, V}).to(at::kFloat), targets.reshape(-1), {}, at::Reduction::Mean,
                                /*ignore_index=*/-1);
}

void expect_cross_entropy(Group& tp, at::ScalarType dtype, double tolerance) {
  const int64_t N = tp.size(), r = tp.rank();
  const Batch batch = make_batch(5);
  at::Tensor full = batch.logits.to(dtype).requires_grad_();
  at::Tensor expected = reference_loss(full, batch.targets);
  expected.backward();

  at::Tensor local = full.detach().chunk(N, -1)[r].clone().requires_grad_();
  at::Tensor loss = tessera::vocab_parallel_cross_entropy(local, batch.targets, tp);
  loss.backward();
  const std::string what = std::string("N=") + std::to_string(N) + " rank " + std::to_string(r) + " " +
                           c10::toString(dtype);
  EXPECT_EQ(loss.scalar_type(), at::kFloat);
  EXPECT_EQ(local.grad().scalar_type(), dtype);
  EXPECT_TRUE(all_close(loss, expected, tolerance, tolerance)) << what << ": loss";
  EXPECT_TRUE(all_close(local.grad(), full.grad().chunk(N, -1)[r], tolerance, tolerance)) << what << ": dlogits";
}

// x = wte[idx] + h; logits = x wte^T; loss = cross_entropy(logits, targets).
void expect_tied_embedding(Group& tp) {
  const int64_t N = tp.size(), r = tp.rank();
  auto gen = at::make_generator<at::CPUGeneratorImpl>(9);
  const at::Tensor wte0 = at::randn({V, C}, gen), h0 = at::randn({B, T, C}, gen);
  const at::Tensor idx = at::randint(V, {B, T}, gen);
  const at::Tensor targets = make_batch(6).targets;

  at::Tensor wte = wte0.clone().requires_grad_(), h = h0.clone().requires_grad_();
  at::Tensor expected = reference_loss(at::linear(at::embedding(wte, idx) + h, wte), targets);
  expected.backward();

  const tessera::VocabShard shard = tessera::vocab_shard(V, tp);
  EXPECT_EQ(shard.start, r * V / N);
  EXPECT_EQ(shard.size, V / N);
  at::Tensor rows = wte0.narrow(0, shard.start, shard.size).clone().requires_grad_();
  at::Tensor hr = h0.clone().requires_grad_();
  at::Tensor x = tessera::vocab_parallel_embedding(idx, rows, tp) + hr;
  EXPECT_TRUE(all_close(x, at::embedding(wte0, idx) + h0, 1e-6, 1e-6)) << "embedding rank " << r;
  at::Tensor logits = at::linear(tessera::copy_to_tp(x, tp), rows);  // [B, T, V/N]
  tp.reset_traffic();
  at::Tensor loss = tessera::vocab_parallel_cross_entropy(logits, targets, tp);
  // max, then (sum of exponentials, target logit): 3 float32 per position, all-reduced.
  EXPECT_EQ(tp.traffic()["all_reduce"], 2 * (N - 1) * 3 * B * T * 4 / N) << "rank " << r;
  loss.backward();
  const std::string what = "tied N=" + std::to_string(N) + " rank " + std::to_string(r);
  EXPECT_TRUE(all_close(loss, expected, 1e-6, 1e-6)) << what << ": loss";
  EXPECT_TRUE(all_close(rows.grad(), wte.grad().narrow(0, shard.start, shard.size), 1e-6, 1e-6)) << what << ": dwte";
  EXPECT_TRUE(all_close(hr.grad(), h.grad(), 1e-6, 1e-6)) << what << ": dh";
}

void run_case(int world) {
  tessera::test::Ranks ranks(world);
  if (!ranks.is_worker()) return ranks.expect_success();
  tessera::ParallelOptions options;
  options.tp = world;
  auto mesh = ranks.connect(options);
  Group& tp = mesh->group("tp");
  expect_cross_entropy(tp, at::kFloat, 1e-6);
  expect_cross_entropy(tp, at::kBFloat16, 1e-2);
  expect_tied_embedding(tp);
  using tessera::test::throws_naming;
  EXPECT_TRUE(throws_naming([&] { tessera::vocab_shard(V + 2 * world - 1, tp); },
                            {"model.vocab_size = " + std::to_string(V + 2 * world - 1),
                             "parallel.tp = " + std::to_string(world)}));
}

TEST(VocabParallel, TwoRanksMatchOneDevice) { run_case(2); }
TEST(VocabParallel, FourRanksMatchOneDevice) { run_case(4); }

}  // namespace vocab_parallel_test
