// Random streams (core/random_streams.h): seeding by coordinates, the model-parallel fork, the
// saved states, and a block's dropout sites drawing from the stream they are given, also through
// activation checkpointing's recomputation.
#include <gtest/gtest.h>

#include <torch/types.h>
#include <torch/utils.h>

#include "core/random_streams.h"
#include "memory/activation_checkpointing.h"
#include "model/block.h"
#include "model/transformer.h"

namespace tessera {
namespace {

using random::Stream;

at::Tensor draw() { return torch::rand({64}); }  // from the CPU's default generator
at::Tensor draw_from(Stream s) { return random::fork(s, at::Device(at::kCPU), draw); }

TEST(RandomStreams, SharedStreamFollowsTheReplicaAndModelParallelStreamTheRank) {
  auto first_draws = [](int64_t replica, int64_t tp_rank) {
    random::seed_streams(7, replica, tp_rank);
    at::Tensor shared = draw_from(Stream::shared);
    return std::make_pair(shared, draw_from(Stream::model_parallel));
  };
  const auto [shared_00, own_00] = first_draws(0, 0);
  const auto [shared_01, own_01] = first_draws(0, 1);
  const auto [shared_10, own_10] = first_draws(1, 0);
  EXPECT_TRUE(shared_00.equal(shared_01)) << "one tp group: the same shared masks";
  EXPECT_FALSE(shared_00.equal(shared_10)) << "another replica (dp, sp or pp): other shared masks";
  EXPECT_FALSE(own_00.equal(own_01)) << "tp ranks: their own model-parallel masks";
  EXPECT_FALSE(own_00.equal(own_10));
  EXPECT_FALSE(own_00.equal(shared_00));
  EXPECT_TRUE(first_draws(0, 1).second.equal(own_01)) << "reproducible from (seed, replica, tp rank)";
}

TEST(RandomStreams, ForkContinuesItsOwnStreamAndLeavesTheSharedOneAlone) {
  random::seed_streams(3, 0, 0);
  const at::Tensor s1 = draw(), s2 = draw();
  random::seed_streams(3, 0, 0);
  const at::Tensor m1 = draw_from(Stream::model_parallel);
  EXPECT_TRUE(draw().equal(s1)) << "the model-parallel draw did not advance the shared stream";
  const at::Tensor m2 = draw_from(Stream::model_parallel);
  EXPECT_FALSE(m1.equal(m2)) << "the model-parallel stream continues, it does not restart";
  EXPECT_TRUE(draw().equal(s2));
}

TEST(RandomStreams, SavedStatesReplayBothStreams) {
  random::seed_streams(11, 2, 1);
  draw_from(Stream::model_parallel);
  draw();
  const auto saved = random::states();
  ASSERT_EQ(saved.size(), 2u);
  EXPECT_EQ(saved[0].first, "shared.cpu");
  EXPECT_EQ(saved[1].first, "model_parallel.cpu");
  const at::Tensor shared = draw(), own = draw_from(Stream::model_parallel);
  random::seed_streams(99, 0, 0);
  random::load_states(saved, std::nullopt, "test");
  EXPECT_TRUE(draw().equal(shared));
  EXPECT_TRUE(draw_from(Stream::model_parallel).equal(own));
  EXPECT_THROW(random::load_states({{"shared.cuda", saved[0].second}}, std::nullopt, "test"), std::exception);
  EXPECT_THROW(random::load_states({{"private.cpu", saved[0].second}}, std::nullopt, "test"), std::exception);
}

// A GPT block with dropout 0.5 in training mode and its output, its input's gradient.
struct BlockRun {
  at::Tensor y, dx;
};
BlockRun run_block(Block& block, const at::Tensor& x0, bool checkpointed) {
  at::Tensor x = x0.clone().requires_grad_(true);
  at::Tensor y = checkpointed ? checkpoint([&](const at::Tensor& in) { return block->forward(in).x; }, x)
                              : block->forward(x).x;
  y.pow(2).sum().backward();
  return {y.detach(), x.grad()};
}

TEST(RandomStreams, BlockDropoutSitesDrawFromTheirStreams) {
  ModelOptions o;
  o.n_layer = 1;
  o.n_head = 2;
  o.n_embd = 16;
  o.block_size = 8;
  o.dropout = 0.5;
  torch::manual_seed(0);
  TransformerLM model(o);  // initialises the block's parameters from their declarations
  Block block = model->block(0);
  block->train();
  ASSERT_TRUE(block->forward(torch::randn({2, 8, 16})).x.isfinite().all().item<bool>());
  const at::Tensor x = torch::randn({2, 8, 16});

  // Both sites shared: the shared stream advances, the model-parallel one does not.
  random::seed_streams(5, 0, 0);
  const auto before = random::states();
  const BlockRun shared = run_block(block, x, false);
  const auto after_shared = random::states();
  EXPECT_FALSE(after_shared[0].second.equal(before[0].second));
  EXPECT_TRUE(after_shared[1].second.equal(before[1].second));

  // Attention on the model-parallel stream, residual on the shared: both advance, and the output
  // differs from the all-shared run (other attention masks).
  DropoutStreams streams;
  streams.attention = Stream::model_parallel;
  block->set_dropout_streams(streams);
  random::seed_streams(5, 0, 0);
  const BlockRun split = run_block(block, x, false);
  const auto after_split = random::states();
  EXPECT_FALSE(after_split[1].second.equal(before[1].second));
  EXPECT_FALSE(split.y.equal(shared.y));

  // Everything on the model-parallel stream: the shared stream is untouched.
  streams.residual = Stream::model_parallel;
  block->set_dropout_streams(streams);
  random::seed_streams(5, 0, 0);
  const BlockRun own = run_block(block, x, false);
  EXPECT_TRUE(random::states()[0].second.equal(before[0].second));
  EXPECT_FALSE(own.y.equal(split.y)) << "the residual masks came from the other stream";

  // Activation checkpointing recomputes with the same masks on both streams: equal outputs and
  // gradients, and the streams end where the plain run left them.
  for (const bool attention_mp : {false, true}) {
    streams.attention = attention_mp ? Stream::model_parallel : Stream::shared;
    streams.residual = Stream::shared;
    block->set_dropout_streams(streams);
    random::seed_streams(5, 0, 0);
    const BlockRun plain = run_block(block, x, false);
    const auto plain_states = random::states();
    random::seed_streams(5, 0, 0);
    const BlockRun recomputed = run_block(block, x, true);
    EXPECT_TRUE(recomputed.y.equal(plain.y)) << "attention on model_parallel: " << attention_mp;
    EXPECT_TRUE(recomputed.dx.allclose(plain.dx, 1e-6, 1e-6)) << "attention on model_parallel: " << attention_mp;
    const auto states = random::states();
    EXPECT_TRUE(states[0].second.equal(plain_states[0].second));
    EXPECT_TRUE(states[1].second.equal(plain_states[1].second));
  }
}

}  // namespace
}  // namespace tessera
