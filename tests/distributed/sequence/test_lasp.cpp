// LASP (parallel/sequence/lasp.h) against the whole sequence on one process: W ranks each hold
// one contiguous chunk; outputs and the gradients of a loss summed over all chunks must equal the
// single-process lightning attention's, for the ring and the all-gather variant, W = 2, 4, 8.
#include <ATen/ATen.h>
#include <torch/types.h>
#include <torch/utils.h>

#include "distributed/dist_test.h"
#include "model/linear_attention.h"
#include "parallel/sequence/lasp.h"
#include "test_util.h"

namespace lasp_test {

using tessera::LaspVariant;

struct Problem {
  at::Tensor q, k, v, decay, weight;  // weight: the loss is sum(o * weight)
};

// B = 2, H = 3, T = 48, d_k = 8, d_v = 6; decays spread over (0.5, 1) so that the state carried
// across chunks matters. Identical on every rank (fixed seed).
Problem make_problem() {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(2024);
  Problem p;
  p.q = at::randn({2, 3, 48, 8}, gen);
  p.k = at::randn({2, 3, 48, 8}, gen) * 0.5;
  p.v = at::randn({2, 3, 48, 6}, gen);
  p.decay = at::tensor({0.5, 0.9, 0.99});
  p.weight = at::randn({2, 3, 48, 6}, gen);
  return p;
}

constexpr int64_t kChunk = 4;  // the lightning chunk inside each rank's part (not a divisor of every part)

void expect_lasp_matches_whole_sequence(tessera::comm::Group& sp, LaspVariant variant) {
  const Problem p = make_problem();
  const int64_t W = sp.size(), t = sp.rank(), T = p.q.size(2), Tc = T / W;

  at::Tensor q = p.q.clone().requires_grad_(), k = p.k.clone().requires_grad_(), v = p.v.clone().requires_grad_();
  at::Tensor whole = tessera::lightning_attention_chunked(q, k, v, p.decay, kChunk);
  (whole * p.weight).sum().backward();

  auto part = [&](const at::Tensor& x) { return x.narrow(2, t * Tc, Tc).detach().clone(); };
  at::Tensor qt = part(p.q).requires_grad_(), kt = part(p.k).requires_grad_(), vt = part(p.v).requires_grad_();
  sp.reset_traffic();
  at::Tensor o = tessera::lasp_attention(qt, kt, vt, p.decay, kChunk, sp, variant);
  (o * part(p.weight)).sum().backward();

  const std::string what = std::string(variant == LaspVariant::ring ? "ring" : "allgather") + " W=" +
                           std::to_string(W) + " rank " + std::to_string(t);
  EXPECT_TRUE(tessera::test::all_close(o, part(whole), 1e-5, 1e-5)) << what << ": output";
  EXPECT_TRUE(tessera::test::all_close(qt.grad(), part(q.grad()), 1e-5, 1e-5)) << what << ": dq";
  EXPECT_TRUE(tessera::test::all_close(kt.grad(), part(k.grad()), 1e-5, 1e-5)) << what << ": dk";
  EXPECT_TRUE(tessera::test::all_close(vt.grad(), part(v.grad()), 1e-5, 1e-5)) << what << ": dv";

  // What crosses ranks is the [B, H, d_k, d_v] float32 state only, whatever the sequence length.
  const int64_t state_bytes = 2 * 3 * 8 * 6 * 4;
  const auto traffic = sp.traffic();
  if (variant == LaspVariant::ring) {
    const int64_t messages = (t + 1 < W ? 1 : 0) + (t > 0 ? 1 : 0);  // forward to t+1, backward to t-1
    EXPECT_EQ(sp.bytes_sent(), messages * state_bytes) << what;
  } else {
    EXPECT_EQ(sp.bytes_sent(), 2 * (W - 1) * state_bytes) << what << " (two all-gathers of one state each)";
    EXPECT_EQ(traffic.count("send"), 0u) << what;
  }
}

void run_case(int world) {
  tessera::test::Ranks ranks(world);
  if (!ranks.is_worker()) return ranks.expect_success();
  tessera::ParallelOptions options;
  options.sp = world;
  auto mesh = ranks.connect(options);
  expect_lasp_matches_whole_sequence(mesh->group("sp"), LaspVariant::ring);
  expect_lasp_matches_whole_sequence(mesh->group("sp"), LaspVariant::allgather);
}

TEST(Lasp, TwoRanksMatchTheWholeSequence) { run_case(2); }
TEST(Lasp, FourRanksMatchTheWholeSequence) { run_case(4); }
TEST(Lasp, EightRanksMatchTheWholeSequence) { run_case(8); }

TEST(Lasp, VariantNamesAndArchitectureAreChecked) {
  EXPECT_EQ(tessera::lasp_variant("lasp"), LaspVariant::ring);
  EXPECT_EQ(tessera::lasp_variant("lasp2"), LaspVariant::allgather);
  EXPECT_TRUE(tessera::test::throws_naming([] { tessera::lasp_variant("ulysses"); }, {"parallel.sp_method", "ulysses"}));
}

}  // namespace lasp_test
