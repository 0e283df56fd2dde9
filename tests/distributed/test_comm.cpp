// The comm layer against exact arithmetic on 2-4 ranks: every collective's result, the ring
// reduce-scatter's traffic ((N-1)/N of the input per rank, not an all-reduce's 2(N-1)/N), and the
// mesh groups matching ParallelDims, and composite operations (run_async) keeping the group's order.
#include <atomic>
#include <chrono>
#include <thread>

#include <ATen/ATen.h>

#include "core/error.h"
#include "dist_test.h"
#include "memory/host_memory_stats.h"
#include "test_util.h"

namespace {

using tessera::comm::ReduceOp;

// Rank r's tensor: r + 1 + i * 0.5 at index i.
at::Tensor rank_tensor(int64_t rank, int64_t n) {
  return at::arange(n, at::kFloat) * 0.5 + static_cast<double>(rank + 1);
}

TEST(Comm, AllReduceSumAvgMaxAndBroadcast) {
  tessera::test::Ranks ranks(4);
  if (!ranks.is_worker()) return ranks.expect_success();
  auto mesh = ranks.connect();
  auto& world = mesh->world();
  ASSERT_EQ(world.size(), 4);
  at::Tensor expected_sum = at::zeros({10});
  for (int64_t r = 0; r < 4; ++r) expected_sum += rank_tensor(r, 10);

  at::Tensor t = rank_tensor(world.rank(), 10);
  world.all_reduce(t);
  EXPECT_TRUE(at::equal(t, expected_sum));
  t = rank_tensor(world.rank(), 10);
  world.all_reduce(t, ReduceOp::avg);
  EXPECT_TRUE(at::allclose(t, expected_sum / 4));
  t = rank_tensor(world.rank(), 10);
  world.all_reduce(t, ReduceOp::max);
  EXPECT_TRUE(at::equal(t, rank_tensor(3, 10)));

  at::Tensor bf = rank_tensor(world.rank(), 8).to(at::kBFloat16);
  world.all_reduce(bf);
  EXPECT_TRUE(at::equal(bf.to(at::kFloat), expected_sum.narrow(0, 0, 8).to(at::kBFloat16).to(at::kFloat)));

  at::Tensor b = rank_tensor(world.rank(), 5);
  world.broadcast(b, 2);
  EXPECT_TRUE(at::equal(b, rank_tensor(2, 5)));

  std::vector<at::Tensor> many{rank_tensor(world.rank(), 3), rank_tensor(world.rank(), 4).to(at::kDouble)};
  world.all_reduce(many, ReduceOp::avg);
  EXPECT_TRUE(at::allclose(many[0], expected_sum.narrow(0, 0, 3) / 4));
  EXPECT_TRUE(at::allclose(many[1], (expected_sum.narrow(0, 0, 4) / 4).to(at::kDouble)));
}

TEST(Comm, RingReduceScatterAndAllGather) {
  tessera::test::Ranks ranks(4);
  if (!ranks.is_worker()) return ranks.expect_success();
  auto mesh = ranks.connect();
  auto& world = mesh->world();
  const int64_t n = world.size(), chunk = 6;
  at::Tensor input = rank_tensor(world.rank(), n * chunk);
  at::Tensor full = input.clone();
  world.all_reduce(full);
  world.reset_traffic();

  at::Tensor shard = at::empty({chunk});
  world.reduce_scatter(shard, input);
  EXPECT_TRUE(at::equal(shard, full.narrow(0, world.rank() * chunk, chunk)));
  EXPECT_EQ(world.traffic().at("reduce_scatter"), (n - 1) * chunk * 4);

  at::Tensor avg_shard = at::empty({chunk});
  world.reduce_scatter_async(avg_shard, input, ReduceOp::avg).wait();
  EXPECT_TRUE(at::allclose(avg_shard, full.narrow(0, world.rank() * chunk, chunk) / n));

  at::Tensor gathered = at::empty({n * chunk});
  world.all_gather(gathered, shard);
  EXPECT_TRUE(at::equal(gathered, full));

  // As inside an autograd function's forward: the output a view made under no_grad, the input
  // requiring grad. The communication thread records no autograd, so the in-place ring is allowed.
  at::Tensor tracked = input.clone().requires_grad_();
  at::Tensor base = at::empty({2 * chunk}), view_out;
  {
    at::NoGradGuard no_grad;
    view_out = base.narrow(0, chunk, chunk);
  }
  world.reduce_scatter(view_out, tracked);
  EXPECT_TRUE(at::equal(view_out, shard));

  // Overlap: several async ops in flight, waited out of order, still correct.
  std::vector<at::Tensor> outs;
  std::vector<tessera::comm::Work> works;
  for (int i = 0; i < 3; ++i) {
    outs.push_back(rank_tensor(world.rank(), 4) * (i + 1));
    works.push_back(world.all_reduce_async(outs.back()));
  }
  for (int i = 2; i >= 0; --i) {
    works[i].wait();
    EXPECT_TRUE(at::allclose(outs[i], full.narrow(0, 0, 4) * (i + 1)));
  }
}

// The ring only reads its input and keeps its partial sums in two chunk-sized buffers, the last
// step receiving into the output: 2/N of the input beyond input and output at N = 4, where it held
// a copy of the whole input and a chunk more (5/N) before. ZeRO-2/3 keep up to two units'
// reductions in flight through the backward (data_parallel_reduce.cpp), each one of these.
TEST(Comm, RingReduceScatterHoldsTwoChunksBeyondItsInputAndOutput) {
  tessera::test::Ranks ranks(4);
  if (!ranks.is_worker()) return ranks.expect_success();
  tessera::host_memory::install();
  auto mesh = ranks.connect();
  auto& world = mesh->world();
  const int64_t n = world.size(), chunk = 1 << 16;
  const at::Tensor input = rank_tensor(world.rank(), n * chunk);
  at::Tensor expected = input.clone();
  world.all_reduce(expected);
  at::Tensor shard = at::empty({chunk});
  const int64_t before = tessera::host_memory::current();
  tessera::host_memory::reset_peak();
  world.reduce_scatter(shard, input);
  const int64_t held = tessera::host_memory::peak() - before;
  EXPECT_EQ(held, 2 * chunk * static_cast<int64_t>(sizeof(float))) << "bytes held by the ring beyond input and output";
  EXPECT_EQ(tessera::host_memory::current(), before);
  EXPECT_TRUE(at::equal(shard, expected.narrow(0, world.rank() * chunk, chunk)));
}

TEST(Comm, SendRecvRing) {
  tessera::test::Ranks ranks(3);
  if (!ranks.is_worker()) return ranks.expect_success();
  auto mesh = ranks.connect();
  auto& world = mesh->world();
  const int64_t n = world.size(), me = world.rank();
  at::Tensor incoming = at::empty({7});
  world.send_recv(rank_tensor(me, 7), (me + 1) % n, incoming, (me + n - 1) % n, 5);
  EXPECT_TRUE(at::equal(incoming, rank_tensor((me + n - 1) % n, 7)));
}

// Receives posted ahead, before the peer sends and for two tags the peer sends in the other
// order, each get their own data when waited.
TEST(Comm, ReceivesPostedAheadGetTheirOwnData) {
  tessera::test::Ranks ranks(2);
  if (!ranks.is_worker()) return ranks.expect_success();
  auto mesh = ranks.connect();
  auto& world = mesh->world();
  if (world.rank() == 1) {
    at::Tensor first = at::empty({5}), second = at::empty({5});
    tessera::comm::Work a = world.recv_async(first, 0, 1), b = world.recv_async(second, 0, 2);
    world.barrier();  // rank 0 sends only now
    b.wait();
    a.wait();
    EXPECT_TRUE(at::equal(first, rank_tensor(0, 5)));
    EXPECT_TRUE(at::equal(second, rank_tensor(1, 5)));
  } else {
    world.barrier();
    const at::Tensor x = rank_tensor(1, 5), y = rank_tensor(0, 5);
    tessera::comm::Work sent = world.send_async(x, 1, 2);
    world.send_async(y, 1, 1).wait();
    sent.wait();
  }
}

// A composite operation's inner collectives run inline on the communication thread, in the
// queue position of run_async: the plain all-reduce issued after it is matched with the other
// rank's plain all-reduce even though rank 0's composite is slow to start, and run_async returns
// before its body has run.
TEST(Comm, CompositeOperationKeepsTheGroupOrder) {
  tessera::test::Ranks ranks(2);
  if (!ranks.is_worker()) return ranks.expect_success();
  auto mesh = ranks.connect();
  auto& world = mesh->world();
  const int64_t me = world.rank();
  at::Tensor first = rank_tensor(me, 4), second = rank_tensor(me, 3), plain = rank_tensor(me, 5);
  std::atomic<bool> started{false};
  tessera::comm::Work composite = world.run_async("two all-reduces", [&] {
    started = true;
    if (me == 0) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    world.all_reduce(first);
    second.add_(first.narrow(0, 0, 3));  // compute between the collectives
    world.all_reduce_async(second).wait();
  });
  if (me == 0) {
    EXPECT_TRUE(composite.pending());
  }
  tessera::comm::Work after = world.all_reduce_async(plain);
  after.wait();
  EXPECT_TRUE(started);
  composite.wait();
  const at::Tensor sum_first = rank_tensor(0, 4) + rank_tensor(1, 4);
  EXPECT_TRUE(at::equal(first, sum_first));
  EXPECT_TRUE(at::equal(second, rank_tensor(0, 3) + rank_tensor(1, 3) + 2 * sum_first.narrow(0, 0, 3)));
  EXPECT_TRUE(at::equal(plain, rank_tensor(0, 5) + rank_tensor(1, 5)));
  // A failure inside the body surfaces from the Work.
  tessera::comm::Work failing = world.run_async("failing composite", [] { tessera::fail("the body's own error"); });
  EXPECT_TRUE(tessera::test::throws_naming([&] { failing.wait(); }, {"the body's own error"}));
}

TEST(Comm, MeshGroupsFollowParallelDims) {
  tessera::test::Ranks ranks(4);
  if (!ranks.is_worker()) return ranks.expect_success();
  tessera::ParallelOptions options;
  options.tp = 2;
  auto mesh = ranks.connect(options);
  const int64_t me = mesh->rank();
  EXPECT_EQ(mesh->dims().dp(), 2);
  EXPECT_EQ(mesh->group("tp").ranks(), (std::vector<int64_t>{me / 2 * 2, me / 2 * 2 + 1}));
  EXPECT_EQ(mesh->group("dp").ranks(), (std::vector<int64_t>{me % 2, me % 2 + 2}));
  // A collective on the tp group sums only over the pair.
  at::Tensor t = at::full({2}, static_cast<double>(me));
  mesh->group("tp").all_reduce(t);
  EXPECT_EQ(t[0].item<double>(), static_cast<double>(me / 2 * 2 * 2 + 1));
  at::Tensor d = at::full({2}, static_cast<double>(me));
  mesh->group("dp").all_reduce(d);
  EXPECT_EQ(d[0].item<double>(), static_cast<double>(2 * (me % 2) + 2));
}

}  // namespace
