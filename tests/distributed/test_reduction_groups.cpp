// Reduction groups per parameter (parallel/data/data_parallel.h): with an expert-data-parallel
// group, DataParallel sums each expert gradient over that group only and every other gradient
// over all data-parallel ranks, divides both by the number of data replicas, at every ZeRO stage,
// and the clipping norm counts each group's gradients once.
//
// Four ranks, dp = 4, ep = 2: the edp groups are {0, 2} and {1, 3}. Expert parallelism itself is
// not applied (every rank holds every expert), so the two edp groups stand for the two ep ranks'
// expert shards: after a step the experts agree within an edp group and differ between them,
// while every dense parameter agrees on all four ranks. Each rank runs its own batch; the
// expected gradients are the ranks' local gradients (a plain backward of the same model, shared
// with an all-gather) averaged over the right ranks. Tolerance: float32 summation order only
// (1e-6 relative to the tensor's largest value; measured below 1e-7).
#include <cmath>

#include <ATen/ATen.h>
#include <torch/types.h>
#include <torch/utils.h>

#include "dist_test.h"
#include "model/transformer.h"
#include "optim/clipping.h"
#include "parallel/data/data_parallel.h"
#include "test_util.h"
#include "tiny_config.h"

namespace tessera {
namespace {

// The shared tiny transformer (4 heads, width 32, 2 blocks), block 1 a mixture of experts.
ModelOptions tiny_moe() {
  ModelOptions o = test::tiny_config(16).model;
  o.bias = false;
  o.ffn = "moe";
  o.moe_every = 2;
  return o;
}

TransformerLM fresh_moe_model() {
  torch::manual_seed(1234);
  return TransformerLM(tiny_moe());
}

at::Tensor batch_of(int64_t rank) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(2000 + rank);
  return at::randint(tiny_moe().vocab_size, {2, tiny_moe().block_size + 1}, gen, at::kLong);
}

at::Tensor loss_of(TransformerLM& model, const at::Tensor& batch) {
  const int64_t t = batch.size(1) - 1;
  return model->forward(batch.narrow(1, 0, t), batch.narrow(1, 1, t)).loss;
}

bool is_expert(const TransformerLM& model, const std::string& name) {
  return model->parameter_specs().at(name).reduce == ReductionGroup::expert_data;
}

void expect_close(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  const double scale = std::max(want.abs().max().item<double>(), 1e-12);
  EXPECT_LE((got - want).abs().max().item<double>(), 1e-6 * scale) << what;
}

TEST(ReductionGroups, ExpertGradientsSummedOverTheirGroupAtEveryStage) {
  test::Ranks ranks(4);
  if (!ranks.is_worker()) return ranks.expect_success();
  ParallelOptions layout;
  layout.ep = 2;
  auto mesh = ranks.connect(layout);
  comm::Group& dp = mesh->group("dp");
  comm::Group& edp = mesh->group("edp");
  ASSERT_EQ(edp.ranks(), (std::vector<int64_t>{ranks.rank() % 2, ranks.rank() % 2 + 2}));
  const at::Tensor batch = batch_of(ranks.rank());

  // Every rank's local gradients, shared: local[name][r].
  std::map<std::string, std::vector<at::Tensor>> local;
  {
    TransformerLM model = fresh_moe_model();
    loss_of(model, batch).backward();
    for (const auto& item : model->named_parameters()) {
      at::Tensor all = at::empty({4 * item.value().numel()});
      dp.all_gather(all, item.value().grad().reshape(-1).contiguous());
      all = all.view({4, -1});
      for (int64_t r = 0; r < 4; ++r) local[item.key()].push_back(all[r].view(item.value().sizes()));
    }
  }
  const TransformerLM names = fresh_moe_model();
  // Summed over `over`, divided by the 4 data replicas (with expert parallelism an expert's
  // gradient would carry its ep group's tokens already).
  auto mean_over = [&](const std::string& name, const std::vector<int64_t>& over) {
    at::Tensor sum = at::zeros_like(local.at(name)[0]);
    for (int64_t r : over) sum += local.at(name)[static_cast<size_t>(r)];
    return sum / 4.0;
  };
  // The norm expected from every rank: dense gradients once, each edp group's experts once.
  double squares = 0;
  for (const auto& item : names->named_parameters()) {
    if (!is_expert(names, item.key())) {
      squares += mean_over(item.key(), {0, 1, 2, 3}).pow(2).sum().item<double>();
      continue;
    }
    for (const std::vector<int64_t>& group : {std::vector<int64_t>{0, 2}, std::vector<int64_t>{1, 3}})
      squares += mean_over(item.key(), group).pow(2).sum().item<double>();
  }

  for (int64_t stage = 0; stage <= 3; ++stage) {
    SCOPED_TRACE("zero_stage " + std::to_string(stage));
    TransformerLM model = fresh_moe_model();
    ParallelOptions parallel = layout;
    parallel.zero_stage = stage;
    OptimOptions optim;
    optim.lr = 1e-2;
    DataParallel data(model, ReductionGroups(dp, &edp), parallel, optim);
    data.before_backward(true);
    loss_of(model, batch).backward();
    data.finish_gradients();
    int64_t experts = 0;
    for (const auto& [name, grad] : data.gradients()) {
      const bool expert = is_expert(model, name);
      experts += expert;
      expect_close(grad, mean_over(name, expert ? edp.ranks() : dp.ranks()), name);
    }
    EXPECT_EQ(experts, 2);  // block 1's w_fc and w_proj (no biases)
    EXPECT_NEAR(data.clip_grad_norm(0), std::sqrt(squares), 1e-6 * std::sqrt(squares));
    data.step(optim.lr);
    data.zero_grad();
    // After the step: dense parameters equal on all ranks, experts within an edp group only.
    at::NoGradGuard no_grad;
    auto params = model->named_parameters();
    data.visit_full_parameters([&](const std::vector<std::string>& visited) {
      for (const std::string& name : visited) {
        const at::Tensor p = params[name].detach().reshape(-1).contiguous();
        at::Tensor all = at::empty({4 * p.numel()});
        dp.all_gather(all, p);
        all = all.view({4, -1});
        const int64_t partner = (ranks.rank() + 2) % 4, other = (ranks.rank() + 1) % 4;
        EXPECT_TRUE(all[partner].equal(p)) << name;
        EXPECT_EQ(all[other].equal(p), !is_expert(model, name)) << name;
      }
    });
  }
}

}  // namespace
}  // namespace tessera
