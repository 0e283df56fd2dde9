// The adaptive codecs' probe under sequence parallelism (parallel/activation_probe.h): two LASP
// ranks, each probing its half of the same sequences, measure one process's errors and count its
// elements, so they choose its table. Each rank's loss is the mean over its half of the tokens:
// its gradients are twice one process's, its squared errors four times.
#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <cstdio>

#include "distributed/dist_test.h"
#include "distributed/probe_comparison.h"
#include "model/transformer.h"
#include "parallel/activation_probe.h"
#include "parallel/sequence/sequence_parallel.h"
#include "unit/model/small_model.h"

namespace tessera {
namespace {

ActivationProbe probe(comm::Group* sp) {
  const at::Tensor idx = (torch::manual_seed(21), torch::randint(0, 50, {2, 32}));
  const at::Tensor targets = (torch::manual_seed(22), torch::randint(0, 50, {2, 32}));
  torch::manual_seed(11);
  TransformerLM model(test::small_model("linear", "dense", 64, 0));
  model->train();
  auto codecs = std::make_shared<AdaptiveCodecs>(7);
  model->set_adaptive_activation_codecs(codecs);
  at::Tensor x = idx, y = targets;
  ActivationProbing probing;
  if (sp) {
    apply_sequence_parallel(model, *sp, "lasp");
    const int64_t length = 32 / sp->size();
    model->set_position_offset(sp->rank() * length);
    x = idx.narrow(1, sp->rank() * length, length);
    y = targets.narrow(1, sp->rank() * length, length);
    probing.sequence = sp;
  }
  return probe_activation_codecs(
      model, *codecs, [&] { census_backward(model, model->forward(x, y).loss); },
      [](Block& block, const at::Tensor& h) { return block->forward(h).x; }, probing);
}

TEST(AdaptiveProbeSequenceParallel, TwoLaspRanksMeasureOneProcesssErrorsAndChooseItsTable) {
  test::Ranks ranks(2);
  if (!ranks.is_worker()) {
    ranks.expect_success();
    return ranks.print_lines("measured:");
  }
  ParallelOptions options;
  options.sp = 2;
  auto mesh = ranks.connect(options);
  const ActivationProbe whole = probe(nullptr);
  const ActivationProbe split = probe(&mesh->group("sp"));
  const double worst = test::worst_probe_difference(whole, split, 4);
  EXPECT_LT(worst, 1e-4);
  EXPECT_EQ(split.codecs, whole.codecs);
  std::printf("measured: rank %lld, worst relative error of the sp2 errors against 4x one process's %.2g\n",
              static_cast<long long>(mesh->group("sp").rank()), worst);
}

}  // namespace
}  // namespace tessera
