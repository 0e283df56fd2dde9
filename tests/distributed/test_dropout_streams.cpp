// Dropout under parallelism (core/random_streams.h, parallel/parallelize.h step 0), on 2 and 4
// ranks through parallelize():
// - tp = 2: the residual stream every tp rank holds whole gets the same masks on both ranks (the
//   hidden state after the blocks is bitwise equal), while the attention dropout of each rank's
//   heads draws from its own model-parallel stream (advanced by the forward, different per rank);
//   replicated parameters stay bitwise equal across tp ranks after training steps with dropout;
// - tp = 2 with Megatron-SP: the blocks draw nothing from the shared stream (their residual
//   activations are sequence chunks, masked from the model-parallel stream);
// - dp = 2: two ranks given the same tokens draw different masks (different losses), and the same
//   loss with dropout 0 (the control: the difference is the masks).
#include <torch/types.h>
#include <torch/utils.h>

#include "model/init.h"
#include "core/random_streams.h"
#include "dist_test.h"
#include "parallel/parallelize.h"
#include "tiny_config.h"

namespace tessera {
namespace {

Config tiny(int64_t tp, bool megatron_sp, double dropout) {
  Config c = test::tiny_config(16);
  c.model.dropout = dropout;
  c.train.seed = 5;
  c.parallel.tp = tp;
  c.parallel.megatron_sp = megatron_sp;
  return c;
}

at::Tensor tokens(int64_t rows) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(42);
  return at::randint(64, {rows, 17}, gen, at::kLong);
}

// Whether `t` is bitwise equal on every rank of `group`.
bool equal_across(comm::Group& group, const at::Tensor& t) {
  at::Tensor all = at::empty({group.size() * t.numel()}, t.options());
  group.all_gather(all, t.contiguous().reshape(-1));
  for (int64_t r = 1; r < group.size(); ++r)
    if (!all.narrow(0, r * t.numel(), t.numel()).equal(all.narrow(0, 0, t.numel()))) return false;
  return true;
}

at::Tensor state_of(const std::string& name) {
  for (auto& [n, t] : random::states())
    if (n == name) return t;
  return {};
}

TEST(DropoutStreams, TensorParallelRanksAgreeWhereActivationsAreReplicated) {
  test::Ranks ranks(2);
  if (!ranks.is_worker()) return ranks.expect_success();
  Config c = tiny(2, false, 0.2);
  auto mesh = ranks.connect(c.parallel);
  torch::manual_seed(c.train.seed);
  auto parallel = parallelize(TransformerLM(c.model, ModelStage{}, at::TensorOptions().device(at::kMeta)), mesh.get(), c, make_layout(c, mesh->dims()),
                              mesh->device(), draw_model_seed());
  TransformerLM& model = parallel->model();
  at::Tensor hidden;
  model->add_block_wrapper([&](int64_t layer, const at::Tensor& x, const TransformerLMImpl::BlockCall& inner) {
    BlockOutput out = inner(x);
    if (layer == c.model.n_layer - 1) hidden = out.x.detach().clone();
    return out;
  });
  comm::Group& tp = mesh->group("tp");
  const at::Tensor own_before = state_of("model_parallel.cpu").clone();
  model->train();
  const at::Tensor batch = tokens(2);
  auto out = model->forward(batch.narrow(1, 0, 16), batch.narrow(1, 1, 16));
  EXPECT_TRUE(equal_across(tp, hidden)) << "the residual stream got different masks on the tp ranks";
  EXPECT_TRUE(equal_across(tp, state_of("shared.cpu")));
  EXPECT_FALSE(state_of("model_parallel.cpu").equal(own_before)) << "attention dropout drew from the own stream";
  EXPECT_FALSE(equal_across(tp, state_of("model_parallel.cpu")));

  // A few steps with dropout: the replicated parameters (LayerNorms, c_proj/mlp.c_proj biases) stay
  // equal across the tp ranks.
  for (int step = 0; step < 3; ++step) parallel->runner().run({{batch.narrow(1, 0, 16), batch.narrow(1, 1, 16)}}, 1e-2, {});
  int replicated = 0;
  for (const auto& item : model->named_parameters()) {
    const ParameterSpec& spec = model->parameter_specs().at(item.key());
    if (spec.split != Split::replicated) continue;
    ++replicated;
    EXPECT_TRUE(equal_across(tp, item.value().detach())) << item.key();
  }
  EXPECT_GT(replicated, 0);
}

TEST(DropoutStreams, MegatronSequenceParallelBlocksDrawFromTheirOwnStreams) {
  test::Ranks ranks(2);
  if (!ranks.is_worker()) return ranks.expect_success();
  auto mesh = ranks.connect(tiny(2, false, 0.2).parallel);
  for (const bool megatron_sp : {false, true}) {
    Config c = tiny(2, megatron_sp, 0.2);
    torch::manual_seed(c.train.seed);
    auto parallel = parallelize(TransformerLM(c.model, ModelStage{}, at::TensorOptions().device(at::kMeta)), mesh.get(), c, make_layout(c, mesh->dims()),
                              mesh->device(), draw_model_seed());
    TransformerLM& model = parallel->model();
    at::Tensor shared_first, shared_last;
    model->add_block_wrapper([&](int64_t layer, const at::Tensor& x, const TransformerLMImpl::BlockCall& inner) {
      if (layer == 0) shared_first = state_of("shared.cpu").clone();
      BlockOutput out = inner(x);
      if (layer == c.model.n_layer - 1) shared_last = state_of("shared.cpu").clone();
      return out;
    });
    model->train();
    const at::Tensor batch = tokens(2);
    model->forward(batch.narrow(1, 0, 16), batch.narrow(1, 1, 16));
    EXPECT_EQ(shared_first.equal(shared_last), megatron_sp)
        << "megatron_sp " << megatron_sp << ": the blocks' residual dropout draws from the "
        << (megatron_sp ? "model-parallel" : "shared") << " stream";
  }
}

TEST(DropoutStreams, DataParallelRanksDrawDifferentMasks) {
  test::Ranks ranks(2);
  if (!ranks.is_worker()) return ranks.expect_success();
  ParallelOptions dp2;
  dp2.dp = 2;
  auto mesh = ranks.connect(dp2);
  for (const double dropout : {0.0, 0.2}) {
    Config c = tiny(1, false, dropout);
    c.parallel.dp = 2;
    torch::manual_seed(c.train.seed);
    auto parallel = parallelize(TransformerLM(c.model, ModelStage{}, at::TensorOptions().device(at::kMeta)), mesh.get(), c, make_layout(c, mesh->dims()),
                              mesh->device(), draw_model_seed());
    parallel->model()->train();
    const at::Tensor batch = tokens(2);  // the same rows on both ranks
    auto out = parallel->model()->forward(batch.narrow(1, 0, 16), batch.narrow(1, 1, 16));
    EXPECT_EQ(equal_across(mesh->group("dp"), out.loss.detach().reshape({1})), dropout == 0)
        << "dropout " << dropout;
  }
}

}  // namespace
}  // namespace tessera
