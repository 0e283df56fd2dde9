// The adaptive codecs' probe under expert parallelism (parallel/activation_probe.h): the two ranks
// of an ep group, each probing the same micro-batch with its half of the experts, measure one
// process's errors and count its elements, so they choose its table. Each expert's gradient on its
// rank sums two copies of every token routed to it (twice one process's, its squared errors four
// times): the probe weighs those by 1/ep^2, everything else by 1/ep, and sums over the group.
#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <cstdio>

#include "dist_test.h"
#include "probe_comparison.h"
#include "model/init.h"
#include "parallel/activation_probe.h"
#include "parallel/parallelize.h"
#include "plan/layout.h"
#include "unit/model/small_model.h"

namespace tessera {
namespace {

Config moe_config(double capacity_factor) {
  Config c;
  c.model = test::small_model("gpt", "moe", 32, 0);
  c.model.moe_capacity_factor = capacity_factor;
  c.train.seq_len = 32;
  c.train.threads = 1;
  c.memory.activation_compression = "adaptive";
  c.memory.activation_bits = 7;
  return c;
}

// The probe of `c`'s model (initialised from seed 5) on one micro-batch, over `mesh` (null: one process).
ActivationProbe probe(const Config& c, comm::Mesh* mesh) {
  const ParallelDims dims(c.parallel, mesh ? mesh->dims().world_size() : 1, "test");
  auto parallel = parallelize(TransformerLM(c.model, ModelStage{}, at::TensorOptions().device(at::kMeta)), mesh, c,
                              make_layout(c, dims), c10::Device(at::kCPU), 5);
  TransformerLM& model = parallel->model();
  model->train();
  const at::Tensor batch = (torch::manual_seed(21), torch::randint(c.model.vocab_size, {2, 33}));
  ActivationProbing probing;
  if (mesh) probing.experts = &mesh->group("ep");
  return probe_activation_codecs(
      model, *model->adaptive_activation_codecs(),
      [&] { census_backward(model, model->forward(batch.narrow(1, 0, 32), batch.narrow(1, 1, 32)).loss); },
      [](Block& block, const at::Tensor& h) { return block->forward(h).x; }, probing);
}

TEST(AdaptiveProbeExpertParallel, TwoEpRanksMeasureOneProcesssErrorsAndChooseItsTable) {
  test::Ranks ranks(2);
  if (!ranks.is_worker()) {
    ranks.expect_success();
    return ranks.print_lines("measured:");
  }
  ParallelOptions options;
  options.dp = 2;
  options.ep = 2;
  auto mesh = ranks.connect(options);
  for (double capacity_factor : {1.25, 0.0}) {  // capacity routing's batched experts, dropless's grouped ones
    Config split_config = moe_config(capacity_factor);
    split_config.parallel = options;
    const ActivationProbe whole = probe(moe_config(capacity_factor), nullptr);
    const ActivationProbe split = probe(split_config, mesh.get());
    const double worst = test::worst_probe_difference(whole, split, 1);
    EXPECT_LT(worst, 1e-4) << "capacity factor " << capacity_factor;
    EXPECT_EQ(split.codecs, whole.codecs) << "capacity factor " << capacity_factor;
    std::printf("measured: rank %lld, capacity factor %.2f: worst relative error of the ep2 errors against one "
                "process's %.2g\n",
                static_cast<long long>(ranks.rank()), capacity_factor, worst);
  }
}

}  // namespace
}  // namespace tessera
