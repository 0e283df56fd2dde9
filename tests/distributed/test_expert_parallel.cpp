// Expert parallelism's pieces on several ranks (parallel/expert/expert_parallel.h): the
// variable-split all-to-all with empty splits, and one MoE layer whose experts are split over an ep
// group, against the same layer whole on one process, when every token goes to one expert (the
// other experts, and a whole ep rank, receive none), under each dispatch; hierarchical dispatch's
// bytes between nodes under node-limited routing; and a model at ep = 2 under full activation
// checkpointing holding its memory flat over 100 steps (nothing kept by the all-to-all's autograd
// function, torchtitan #1467). The harness (tests/equivalence) checks whole models under every
// composition; this checks what it cannot steer.
#include <cstdio>
#include <map>

#include <ATen/ATen.h>
#include <torch/types.h>
#include <torch/utils.h>

#include "dist_test.h"
#include "memory/host_memory_stats.h"
#include "model/init.h"
#include "parallel/parallelize.h"
#include "memory/storage.h"
#include "model/moe.h"
#include "parallel/expert/expert_parallel.h"
#include "test_util.h"

namespace tessera {
namespace {

// Rows member i sends member j, two exchanges: member 2 sends nothing but receives a row, then
// sends and receives nothing; member 0 sends nothing to itself.
const int64_t kRows[2][3][3] = {{{0, 2, 1}, {3, 1, 0}, {0, 0, 0}}, {{0, 2, 0}, {3, 1, 0}, {0, 0, 0}}};

TEST(ExpertParallel, AllToAllWithVariableAndEmptySplits) {
  test::Ranks ranks(3);
  if (!ranks.is_worker()) return ranks.expect_success();
  auto mesh = ranks.connect();
  comm::Group& world = mesh->world();
  const int64_t me = ranks.rank();
  for (const auto& counts : kRows) {
    std::vector<int64_t> send(3), receive(3);
    std::vector<at::Tensor> rows;
    for (int64_t j = 0; j < 3; ++j) {
      send[j] = counts[me][j];
      receive[j] = counts[j][me];
      // Row k of member me's rows for member j holds (me, j, k) in each of its 2 columns.
      for (int64_t k = 0; k < send[j]; ++k) rows.push_back(at::full({1, 2}, static_cast<double>(100 * me + 10 * j + k)));
    }
    const at::Tensor input = rows.empty() ? at::empty({0, 2}) : at::cat(rows, 0);
    at::Tensor output = at::full({receive[0] + receive[1] + receive[2], 2}, -1.0);
    world.reset_traffic();
    world.all_to_all_async(output, input, receive, send).wait();
    int64_t at_row = 0;
    for (int64_t i = 0; i < 3; ++i)
      for (int64_t k = 0; k < receive[i]; ++k, ++at_row)
        EXPECT_EQ(output[at_row][1].item<double>(), static_cast<double>(100 * i + 10 * me + k)) << "from " << i;
    // Bytes that left this rank: its rows to the other members.
    const int64_t away = (send[0] + send[1] + send[2] - send[me]) * 2 * 4;
    EXPECT_EQ(world.traffic()["all_to_all"], away);
  }
}

ModelOptions layer_options(double capacity_factor) {
  ModelOptions o;
  o.n_embd = 8;
  o.mlp_ratio = 2;
  o.ffn = "moe";
  o.moe_experts = 4;
  o.moe_top_k = 1;
  o.moe_capacity_factor = capacity_factor;
  return o;
}

// Every parameter drawn from one seed; the router sends a token whose features are all positive to
// expert 0 (its row +0.5, the others' -0.5).
void fill(MoEImpl& whole) {
  at::NoGradGuard no_grad;
  torch::manual_seed(7);
  for (auto& p : whole.parameters()) p.normal_(0, 0.5);
  whole.router->weight.fill_(-0.5);
  whole.router->weight[0].fill_(0.5);
}

// Rank r's tokens: all features positive.
at::Tensor tokens_of(int64_t rank) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(50 + rank);
  return at::rand({2, 3, 8}, gen) + 0.1;
}

at::Tensor loss_of(const at::Tensor& y) { return (y * at::linspace(-1, 1, y.numel()).view(y.sizes())).sum(); }

// Under each dispatch: alltoall, and hierarchical with the two ranks on two nodes (hop 1 only) and
// on one node (hop 2 only).
TEST(ExpertParallel, ExpertsAndARankWithoutTokensGetZeroGradients) {
  test::Ranks ranks(2);
  if (!ranks.is_worker()) return ranks.expect_success();
  auto mesh = ranks.connect();
  comm::Group& ep = mesh->world();
  const std::pair<const char*, ExpertDispatch> dispatches[] = {
      {"alltoall", {false, {0, 1}}}, {"hierarchical, two nodes", {true, {0, 1}}}, {"hierarchical, one node", {true, {0, 0}}}};
  for (const auto& [dispatch_name, dispatch] : dispatches) {
    for (double factor : {0.0, 1.0}) {  // dropless, and a capacity that drops what expert 0 cannot take
      SCOPED_TRACE(std::string(dispatch_name) + ", capacity factor " + std::to_string(factor));
      const ModelOptions o = layer_options(factor);
      MoE whole(o, at::TensorOptions());
      fill(*whole);
      // One process: both ranks' tokens through the whole layer, gradients summed.
      at::Tensor want_y;
      for (int64_t r = 0; r < 2; ++r) {
        at::Tensor y = whole->forward(tokens_of(r)).y;
        if (r == ranks.rank()) want_y = y.detach();
        loss_of(y).backward();
      }
      // This rank: its experts (2 of 4), the same values.
      MoE split(o, at::TensorOptions().device(at::kMeta));
      apply_expert_parallel(*split, ep, dispatch);
      {
        at::NoGradGuard no_grad;
        auto from = whole->named_parameters();
        for (auto& item : split->named_parameters()) {
          const at::Tensor value = from[item.key()].detach();
          at::Tensor p = item.value();
          materialize_meta_parameter(
              p, item.key() == "router.weight" ? value.clone() : value.chunk(2, 0)[ranks.rank()].clone());
        }
      }
      at::Tensor y = split->forward(tokens_of(ranks.rank())).y;
      EXPECT_TRUE(test::all_close(y, want_y, 1e-6, 1e-6));
      loss_of(y).backward();
      auto want = whole->named_parameters();
      for (const auto& item : split->named_parameters()) {
        if (item.key() == "router.weight") continue;  // its gradient is this rank's tokens' only
        const at::Tensor g = item.value().grad();
        const at::Tensor expected = want[item.key()].grad().chunk(2, 0)[ranks.rank()];
        EXPECT_TRUE(test::all_close(g, expected, 1e-5, 1e-6)) << item.key();
        // Expert 0 (rank 0's first) took every token; the others none: exactly zero.
        const at::Tensor idle = ranks.rank() == 0 ? g.narrow(0, 1, 1) : g;
        EXPECT_EQ(idle.abs().max().item<double>(), 0.0) << item.key();
        if (ranks.rank() == 0) {
          EXPECT_GT(g[0].abs().max().item<double>(), 0.0) << item.key();
        }
      }
    }
  }
}

// Group-limited routing whose groups are the nodes: 8 experts in 2 groups, top 3 from the best one,
// four ranks on two nodes of two (node n holds group n). Under hierarchical dispatch a token
// crosses to the other node at most once, and a forward's bytes between nodes, summed over the
// ranks, are exactly: each hop's counts (8 bytes from each rank to each of the other node's two
// members) and, per token whose group is the other node, its k int32 expert ids, its row of
// C + k floats and its C-float output coming back; under alltoall each of its k choices crosses as
// a C-float row each way. Outputs and expert gradients equal the whole layer's on all tokens.
TEST(ExpertParallel, HierarchicalDispatchSendsATokenOncePerNode) {
  test::Ranks ranks(4);
  if (!ranks.is_worker()) return ranks.expect_success();
  auto mesh = ranks.connect();
  comm::Group& ep = mesh->world();
  const int64_t W = 4, C = 8, E = 8, k = 3, me = ranks.rank();
  ModelOptions o = layer_options(0.0);
  o.moe_experts = E;
  o.moe_top_k = k;
  o.moe_groups = 2;
  o.moe_topk_groups = 1;
  MoE whole(o, at::TensorOptions());
  {
    at::NoGradGuard no_grad;
    torch::manual_seed(11);
    for (auto& p : whole->parameters()) p.normal_(0, 0.5);
  }
  const auto tokens = [](int64_t rank) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(70 + rank);
    return at::randn({4, 5, 8}, gen);
  };
  at::Tensor want_y;
  for (int64_t r = 0; r < W; ++r) {
    at::Tensor y = whole->forward(tokens(r)).y;
    if (r == me) want_y = y.detach();
    loss_of(y).backward();
  }
  const std::vector<int64_t> nodes = {0, 0, 1, 1};
  for (bool hierarchical : {false, true}) {
    SCOPED_TRACE(hierarchical ? "hierarchical" : "alltoall");
    MoE split(o, at::TensorOptions().device(at::kMeta));
    apply_expert_parallel(*split, ep, ExpertDispatch{hierarchical, nodes});
    ep.set_member_nodes(nodes);
    {
      at::NoGradGuard no_grad;
      auto from = whole->named_parameters();
      for (auto& item : split->named_parameters()) {
        const at::Tensor value = from[item.key()].detach();
        at::Tensor p = item.value();
        materialize_meta_parameter(p, item.key() == "router.weight" ? value.clone() : value.chunk(W, 0)[me].clone());
      }
    }
    // This rank's tokens whose group is the other node (x) and their choices (y).
    const at::Tensor x = tokens(me);
    const at::Tensor other = split->route(x.reshape({-1, C})).expert.div(E / 2, "floor").ne(me / 2);
    const at::Tensor crossing = at::tensor({other.any(1).sum().item<double>(), other.sum().item<double>()});
    ep.all_reduce(crossing);
    const double tokens_crossing = crossing[0].item<double>(), choices_crossing = crossing[1].item<double>();
    EXPECT_EQ(choices_crossing, k * tokens_crossing);  // a token's choices all lie in its one group
    EXPECT_GT(tokens_crossing, 0);

    ep.reset_traffic();
    at::Tensor y = split->forward(x).y;
    const at::Tensor inter = at::tensor({static_cast<double>(ep.inter_node_bytes())});
    ep.all_reduce(inter);
    const double expected = hierarchical ? W * 2 * 2 * 8 + tokens_crossing * (4 * k + 4 * (C + k) + 4 * C)
                                         : choices_crossing * 2 * 4 * C;
    EXPECT_EQ(inter.item<double>(), expected);
    EXPECT_TRUE(test::all_close(y, want_y, 1e-5, 1e-6));
    loss_of(y).backward();
    auto want = whole->named_parameters();
    for (const auto& item : split->named_parameters()) {
      if (item.key() == "router.weight") continue;  // its gradient is this rank's tokens' only
      EXPECT_TRUE(test::all_close(item.value().grad(), want[item.key()].grad().chunk(W, 0)[me], 1e-5, 1e-6))
          << item.key();
    }
  }
}

// The counting allocator's live bytes after step 10 and step 100, and each step's peak, of a
// two-rank ep = 2 model with every block MoE under full activation checkpointing: equal within 1%.
TEST(ExpertParallel, MemoryIsFlatOver100StepsUnderFullCheckpointing) {
  test::Ranks ranks(2);
  if (!ranks.is_worker()) {  // the measured bytes, from every rank's output
    ranks.expect_success();
    return ranks.print_lines("rank ");
  }
  host_memory::install();
  Config c;
  c.model.n_layer = 2;
  c.model.n_head = 2;
  c.model.n_embd = 32;
  c.model.vocab_size = 128;
  c.model.block_size = 32;
  c.model.ffn = "moe";
  c.model.moe_top_k = 2;
  c.train.seq_len = 32;
  c.train.threads = 1;
  c.parallel.dp = 2;
  c.parallel.ep = 2;
  c.memory.activation_checkpointing = "full";
  auto mesh = ranks.connect(c.parallel);
  torch::manual_seed(1);
  auto parallel = parallelize(TransformerLM(c.model, ModelStage{}, at::TensorOptions().device(at::kMeta)), mesh.get(), c,
                              make_layout(c, mesh->dims()), mesh->device(), draw_model_seed());
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7 + ranks.rank());
  std::map<int64_t, std::pair<int64_t, int64_t>> measured;  // step -> (peak of the step, live after it)
  for (int64_t s = 1; s <= 100; ++s) {
    const at::Tensor batch = at::randint(c.model.vocab_size, {2, 33}, gen, at::kLong);
    const int64_t before = host_memory::current();
    host_memory::reset_peak();
    parallel->runner().run({{batch.narrow(1, 0, 32), batch.narrow(1, 1, 32)}}, 1e-3, {});
    if (s == 10 || s == 100) measured[s] = {host_memory::peak() - before, host_memory::current()};
  }
  const auto [peak10, live10] = measured.at(10);
  const auto [peak100, live100] = measured.at(100);
  std::printf("rank %lld: step 10 peak %lld live %lld, step 100 peak %lld live %lld bytes\n",
              static_cast<long long>(ranks.rank()), static_cast<long long>(peak10), static_cast<long long>(live10),
              static_cast<long long>(peak100), static_cast<long long>(live100));
  EXPECT_LE(std::abs(peak100 - peak10), peak10 / 100);
  EXPECT_LE(std::abs(live100 - live10), live10 / 100);
}

}  // namespace
}  // namespace tessera
