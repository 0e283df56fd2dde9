// Softmax-attention sequence parallelism (parallel/sequence/ulysses.h, ring_attention.h,
// softmax_attention_sp.h) against the whole sequence on one process, W = 2 and 4 ranks:
// - Group::all_to_all moves chunk j of member i to chunk i of member j and counts (W-1)/W bytes;
// - each method's output and dq, dk, dv (loss sum(o * w)) equal causal SDPA on the whole
//   sequence (1e-5), and the bytes each rank sends equal the headers' formulas exactly;
// (the whole model under each method, with and without selective checkpointing, against one
// process: rows sp*_ring*, sp*_ulysses* of the equivalence harness, tests/equivalence/);
// - refusals: heads not divisible by W, dropout > 0, arch linear, unknown method, positions past
//   model.block_size.
#include <ATen/ATen.h>
#include <torch/types.h>
#include <torch/utils.h>

#include "distributed/dist_test.h"
#include "model/transformer.h"
#include "parallel/sequence/ring_attention.h"
#include "parallel/sequence/softmax_attention_sp.h"
#include "parallel/sequence/ulysses.h"
#include "test_util.h"

namespace softmax_sp_test {

using tessera::comm::Group;

constexpr int64_t B = 2, H = 4, T = 32, D = 8;

// Member r sends chunk j = [r * 1000 + j * n, ... + n); member j must receive it as its chunk r.
void expect_all_to_all(Group& sp) {
  const int64_t W = sp.size(), r = sp.rank(), n = 5;
  at::Tensor input = at::arange(W * n, at::kFloat) + 1000.0 * r;
  at::Tensor output = at::empty_like(input);
  sp.reset_traffic();
  sp.all_to_all(output, input);
  at::Tensor expected = at::empty_like(input);
  for (int64_t i = 0; i < W; ++i) expected.narrow(0, i * n, n).copy_(at::arange(r * n, (r + 1) * n, at::kFloat) + 1000.0 * i);
  EXPECT_TRUE(at::equal(output, expected)) << "all_to_all on rank " << r << ": " << output;
  EXPECT_EQ(sp.traffic()["all_to_all"], (W - 1) * n * 4) << "rank " << r;
}

struct Problem {
  at::Tensor q, k, v, weight;  // [B, H, T, D]; the loss is sum(o * weight)
};

Problem make_problem() {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  return {at::randn({B, H, T, D}, gen), at::randn({B, H, T, D}, gen), at::randn({B, H, T, D}, gen),
          at::randn({B, H, T, D}, gen)};
}

using Kernel = std::function<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, Group&)>;

// Runs `kernel` on this rank's chunk and compares with the whole sequence; returns the bytes this
// rank sent in forward and in forward + backward.
std::pair<int64_t, int64_t> expect_matches_whole_sequence(Group& sp, const Kernel& kernel, const std::string& name) {
  const Problem p = make_problem();
  const int64_t W = sp.size(), t = sp.rank(), C = T / W;
  at::Tensor q = p.q.clone().requires_grad_(), k = p.k.clone().requires_grad_(), v = p.v.clone().requires_grad_();
  at::Tensor whole = at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true);
  (whole * p.weight).sum().backward();

  auto part = [&](const at::Tensor& x) { return x.narrow(2, t * C, C).detach().clone(); };
  at::Tensor qt = part(p.q).requires_grad_(), kt = part(p.k).requires_grad_(), vt = part(p.v).requires_grad_();
  sp.reset_traffic();
  at::Tensor o = kernel(qt, kt, vt, sp);
  const int64_t forward_bytes = sp.bytes_sent();
  (o * part(p.weight)).sum().backward();

  const std::string what = name + " W=" + std::to_string(W) + " rank " + std::to_string(t);
  EXPECT_TRUE(tessera::test::all_close(o, part(whole), 1e-5, 1e-5)) << what << ": output";
  EXPECT_TRUE(tessera::test::all_close(qt.grad(), part(q.grad()), 1e-5, 1e-5)) << what << ": dq";
  EXPECT_TRUE(tessera::test::all_close(kt.grad(), part(k.grad()), 1e-5, 1e-5)) << what << ": dk";
  EXPECT_TRUE(tessera::test::all_close(vt.grad(), part(v.grad()), 1e-5, 1e-5)) << what << ": dv";
  return {forward_bytes, sp.bytes_sent()};
}

void expect_ulysses(Group& sp) {
  const auto [forward, total] = expect_matches_whole_sequence(sp, tessera::ulysses_attention, "ulysses");
  // One all-to-all of stacked q, k, v and one of y forward, of dy and of dq, dk, dv backward;
  // each sends (W-1)/W of its input: 4 and 8 chunks of B H C d float32 elements in all.
  const int64_t W = sp.size(), block = B * H * (T / W) * D * 4;
  EXPECT_EQ(forward, 4 * block * (W - 1) / W) << "ulysses rank " << sp.rank();
  EXPECT_EQ(total, 8 * block * (W - 1) / W) << "ulysses rank " << sp.rank();
  EXPECT_EQ(sp.traffic().count("send"), 0u);
}

void expect_ring(Group& sp) {
  const auto [forward, total] = expect_matches_whole_sequence(sp, tessera::ring_attention, "ring");
  // Rank t < W-1 passes the K and V blocks of ranks 0..t to t+1 in forward and again in backward;
  // every rank passes a float32 (dK, dV) accumulator at each of W backward steps.
  const int64_t W = sp.size(), t = sp.rank(), block = B * H * (T / W) * D * 4;
  const int64_t key_value = t + 1 < W ? 2 * (t + 1) * block : 0;
  EXPECT_EQ(forward, key_value) << "ring rank " << t;
  EXPECT_EQ(total, 2 * key_value + 2 * W * block) << "ring rank " << t;
  EXPECT_EQ(sp.traffic().count("all_to_all"), 0u);
}

tessera::ModelOptions tiny_gpt(int64_t n_head) {
  tessera::ModelOptions o;
  o.vocab_size = 64;
  o.n_layer = 2;
  o.n_head = n_head;
  o.n_embd = 8 * n_head;
  o.block_size = 48;
  return o;
}

void run_case(int world) {
  tessera::test::Ranks ranks(world);
  if (!ranks.is_worker()) return ranks.expect_success();
  tessera::ParallelOptions options;
  options.sp = world;
  auto mesh = ranks.connect(options);
  Group& sp = mesh->group("sp");
  expect_all_to_all(sp);
  expect_ulysses(sp);
  expect_ring(sp);
}

TEST(SoftmaxSequenceParallel, TwoRanksMatchTheWholeSequence) { run_case(2); }
TEST(SoftmaxSequenceParallel, FourRanksMatchTheWholeSequence) { run_case(4); }

TEST(SoftmaxSequenceParallel, UlyssesKernelRefusesHeadsItCannotSplit) {
  tessera::test::Ranks ranks(2);
  if (!ranks.is_worker()) return ranks.expect_success();
  tessera::ParallelOptions options;
  options.sp = 2;
  auto mesh = ranks.connect(options);
  Group& sp = mesh->group("sp");
  // The layout validator refuses such layouts by key (tests/unit/parallel/test_layout.cpp); the
  // kernel still guards its own shapes.
  const at::Tensor x = at::zeros({1, 3, 4, 8});
  EXPECT_TRUE(tessera::test::throws_naming([&] { tessera::ulysses_attention(x, x, x, sp); },
                                           {"parallel.sp = 2", "3 heads"}));
}

TEST(SoftmaxSequenceParallel, MethodAndPositionsAreChecked) {
  using tessera::test::throws_naming;
  EXPECT_EQ(tessera::softmax_sp_method("ulysses"), tessera::SoftmaxSpMethod::ulysses);
  EXPECT_EQ(tessera::softmax_sp_method("ring"), tessera::SoftmaxSpMethod::ring);
  EXPECT_TRUE(throws_naming([] { tessera::softmax_sp_method("lasp"); }, {"parallel.sp_method", "lasp"}));


  // Positions offset .. offset+T-1 must exist in wpe; the offset shifts exactly the embedding rows.
  torch::manual_seed(3);
  tessera::TransformerLM model(tiny_gpt(4));
  const at::Tensor idx = at::randint(64, {1, 8});
  model->set_position_offset(40);
  const at::Tensor shifted = model->forward(idx).logits;
  EXPECT_TRUE(throws_naming([&] { model->forward(at::zeros({1, 9}, at::kLong)); }, {"model.block_size = 48", "40..48"}));
  model->set_position_offset(0);
  EXPECT_TRUE(throws_naming([&] { model->forward(at::zeros({1, 49}, at::kLong)); }, {"model.block_size = 48"}));
  {
    torch::NoGradGuard no_grad;
    model->wpe->weight.narrow(0, 0, 8).copy_(model->wpe->weight.narrow(0, 40, 8).clone());
  }
  EXPECT_TRUE(tessera::test::all_close(model->forward(idx).logits, shifted, 0, 0));
}

}  // namespace softmax_sp_test
