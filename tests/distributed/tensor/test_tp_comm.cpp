// The tensor-parallel communication functions (parallel/tensor/tp_comm.h) at N = 2 and 4 ranks:
// each function's forward value and the gradient autograd gives its input equal the formulas,
// written with the tensors of every rank (each rank can draw all of them from their seeds):
//
//   function                     y on rank r                       dL/dx on rank r (L = Σ y ⊙ w_r)
//   copy_to_tp                   x_r                               Σ_s w_s
//   reduce_from_tp               Σ_s x_s                           w_r
//   scatter_to_tp                chunk_r(x_r, -1)                  cat_s(w_s, -1)
//   gather_from_tp               cat_s(x_s, -1)                    chunk_r(w_r, -1)
//   scatter_to_sequence          chunk_r(x_r, 1)                   cat_s(w_s, 1)
//   gather_from_sequence         cat_s(x_s, 1)                     chunk_r(Σ_s w_s, 1)
//   reduce_scatter_to_sequence   chunk_r(Σ_s x_s, 1)               cat_s(w_s, 1)
//
// (w_r differs per rank on purpose, so a backward that used the wrong collective fails.) Also:
// the sequence pair sends the bytes of its formula, every function is the identity for N = 1, and
// a dimension not divisible by N is refused naming parallel.tp.
#include <ATen/ATen.h>
#include <torch/types.h>
#include <torch/utils.h>

#include "distributed/dist_test.h"
#include "parallel/tensor/tp_comm.h"
#include "test_util.h"

namespace tp_comm_test {  // named: the unity batch holds test_vocab_parallel.cpp and test_tensor_parallel.cpp too

using tessera::comm::Group;

constexpr int64_t B = 2, T = 8, D = 12;  // T and D divisible by 2 and 4

at::Tensor draw(std::vector<int64_t> shape, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randn(shape, gen);
}

using Fn = at::Tensor (*)(const at::Tensor&, Group&);

// Applies fn to x_r (shape in_shape, seed 100 + r), backpropagates Σ y ⊙ w_r (shape out_shape,
// seed 200 + r), and compares with the formulas given every rank's x_s and w_s.
void expect_function(Group& tp, const std::string& name, Fn fn, std::vector<int64_t> in_shape,
                     std::vector<int64_t> out_shape,
                     const std::function<at::Tensor(const std::vector<at::Tensor>&)>& expected_y,
                     const std::function<at::Tensor(const std::vector<at::Tensor>&)>& expected_grad) {
  const int64_t N = tp.size(), r = tp.rank();
  std::vector<at::Tensor> xs, ws;
  for (int64_t s = 0; s < N; ++s) {
    xs.push_back(draw(in_shape, 100 + s));
    ws.push_back(draw(out_shape, 200 + s));
  }
  at::Tensor x = xs[r].clone().requires_grad_();
  at::Tensor y = fn(x, tp);
  (y * ws[r]).sum().backward();
  const std::string what = name + " N=" + std::to_string(N) + " rank " + std::to_string(r);
  EXPECT_TRUE(tessera::test::all_close(y, expected_y(xs), 1e-6, 1e-6)) << what << ": forward";
  EXPECT_TRUE(tessera::test::all_close(x.grad(), expected_grad(ws), 1e-6, 1e-6)) << what << ": gradient";
}

at::Tensor sum(const std::vector<at::Tensor>& ts) { return at::stack(ts).sum(0); }

void expect_all_functions(Group& tp) {
  const int64_t N = tp.size(), r = tp.rank();
  auto chunk = [N, r](const at::Tensor& t, int64_t dim) { return t.chunk(N, dim)[r]; };
  auto mine = [r](const std::vector<at::Tensor>& ts) { return ts[r]; };
  auto cat_last = [](const std::vector<at::Tensor>& ts) { return at::cat(ts, -1); };
  auto cat_seq = [](const std::vector<at::Tensor>& ts) { return at::cat(ts, 1); };
  const std::vector<int64_t> full{B, T, D}, last_part{B, T, D / N}, seq_part{B, T / N, D};

  expect_function(tp, "copy_to_tp", tessera::copy_to_tp, full, full, mine, sum);
  expect_function(tp, "reduce_from_tp", tessera::reduce_from_tp, full, full, sum, mine);
  expect_function(
      tp, "scatter_to_tp", tessera::scatter_to_tp, full, last_part,
      [&](const std::vector<at::Tensor>& xs) { return chunk(xs[r], -1); }, cat_last);
  expect_function(
      tp, "gather_from_tp", tessera::gather_from_tp, last_part, full, cat_last,
      [&](const std::vector<at::Tensor>& ws) { return chunk(ws[r], -1); });
  expect_function(
      tp, "scatter_to_sequence", tessera::scatter_to_sequence, full, seq_part,
      [&](const std::vector<at::Tensor>& xs) { return chunk(xs[r], 1); }, cat_seq);
  expect_function(
      tp, "gather_from_sequence", tessera::gather_from_sequence, seq_part, full, cat_seq,
      [&](const std::vector<at::Tensor>& ws) { return chunk(sum(ws), 1); });
  expect_function(
      tp, "reduce_scatter_to_sequence", tessera::reduce_scatter_to_sequence, full, seq_part,
      [&](const std::vector<at::Tensor>& xs) { return chunk(sum(xs), 1); }, cat_seq);
}

// gather_from_sequence sends (N-1)/N of the gathered tensor forward and the same in its
// reduce-scatter backward; reduce_from_tp sends 2(N-1)/N of its tensor forward, nothing backward.
void expect_bytes(Group& tp) {
  const int64_t N = tp.size(), full_bytes = B * T * D * 4;
  at::Tensor x = draw({B, T / N, D}, 1).requires_grad_();
  tp.reset_traffic();
  at::Tensor y = tessera::gather_from_sequence(x, tp);
  EXPECT_EQ(tp.traffic()["all_gather"], (N - 1) * full_bytes / N);
  y.sum().backward();
  EXPECT_EQ(tp.traffic()["reduce_scatter"], (N - 1) * full_bytes / N);

  at::Tensor z = draw({B, T, D}, 2).requires_grad_();
  tp.reset_traffic();
  tessera::reduce_from_tp(z, tp).sum().backward();
  EXPECT_EQ(tp.bytes_sent(), 2 * (N - 1) * full_bytes / N);
}

void run_case(int world) {
  tessera::test::Ranks ranks(world);
  if (!ranks.is_worker()) return ranks.expect_success();
  tessera::ParallelOptions options;
  options.tp = world;
  auto mesh = ranks.connect(options);
  Group& tp = mesh->group("tp");
  ASSERT_EQ(tp.size(), world);
  expect_all_functions(tp);
  expect_bytes(tp);
  using tessera::test::throws_naming;
  const at::Tensor odd = at::zeros({B, 6, 6});
  if (world == 4) {
    EXPECT_TRUE(throws_naming([&] { tessera::scatter_to_sequence(odd, tp); }, {"parallel.tp = 4", "6"}));
    EXPECT_TRUE(throws_naming([&] { tessera::scatter_to_tp(odd, tp); }, {"parallel.tp = 4", "6"}));
  }
}

TEST(TensorParallelComm, TwoRanksMatchTheFormulas) { run_case(2); }
TEST(TensorParallelComm, FourRanksMatchTheFormulas) { run_case(4); }

TEST(TensorParallelComm, OneRankIsTheIdentity) {
  Group single("tp", {0}, 0, nullptr, std::chrono::milliseconds(1000));
  const at::Tensor x = draw({B, T, D}, 3);
  for (Fn fn : {tessera::copy_to_tp, tessera::reduce_from_tp, tessera::scatter_to_tp, tessera::gather_from_tp,
                tessera::scatter_to_sequence, tessera::gather_from_sequence, tessera::reduce_scatter_to_sequence}) {
    at::Tensor leaf = x.clone().requires_grad_();
    at::Tensor y = fn(leaf, single);
    (y * 2).sum().backward();
    EXPECT_TRUE(at::equal(y, x));
    EXPECT_TRUE(at::equal(leaf.grad(), at::full_like(x, 2)));
  }
}

}  // namespace tp_comm_test
