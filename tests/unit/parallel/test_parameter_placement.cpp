// ParameterPlacement (parallel/parameter_placement.h): which pipeline rank holds each parameter, what a stage writes
// (the last stage's copy of the tied embedding is not written), which state tensors belong to
// which parameter, and the tp identity without tensor parallelism. No processes: one-member groups
// stand for the pipeline, the layout is arithmetic.
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include <torch/types.h>
#include <torch/utils.h>

#include "core/parallel_dims.h"
#include "parallel/parameter_placement.h"
#include "plan/layout.h"
#include "tiny_config.h"

namespace tessera {
namespace {

TEST(ParameterPlacement, HoldersWritesAndStateOfATwoStagePipeline) {
  Config c = test::tiny_config(/*seq_len=*/16, /*block_size=*/32);
  c.parallel.pp = 2;
  c.train.grad_accum = 2;
  const Layout layout = make_layout(c, ParallelDims(c.parallel, 2, "test"));
  comm::Group pp("pp", {0}, 0, nullptr, std::chrono::milliseconds(1000));
  const TransformerLM last(c.model, layout.stage_of(1), at::TensorOptions().device(at::kMeta));
  const ParameterPlacement placement(last, layout, /*tp=*/nullptr, &pp);

  const TransformerLM whole(c.model, ModelStage{}, at::TensorOptions().device(at::kMeta));
  int64_t on_first = 0, on_last = 0;
  for (const auto& item : whole->named_parameters()) {
    const std::string& name = item.key();
    const int64_t holder = placement.holder(name);
    if (name.rfind("h.0.", 0) == 0 || name == "wte.weight" || name == "wpe.weight") {
      EXPECT_EQ(holder, 0) << name;
    }
    if (name.rfind("h.1.", 0) == 0 || name.rfind("ln_f.", 0) == 0) {
      EXPECT_EQ(holder, 1) << name;
    }
    (holder == 0 ? on_first : on_last) += 1;
  }
  EXPECT_GT(on_first, 0);
  EXPECT_GT(on_last, 0);

  // The last stage holds the tied embedding's copy, and writes neither it nor its state.
  EXPECT_FALSE(placement.writes("wte.weight"));
  EXPECT_TRUE(placement.writes("ln_f.weight"));
  EXPECT_FALSE(placement.writes_state("optim.wte.weight.exp_avg"));
  EXPECT_TRUE(placement.writes_state("optim.ln_f.weight.exp_avg"));
  EXPECT_TRUE(placement.writes_state("scaler.scale"));

  EXPECT_EQ(placement.parameter_of("optim.h.1.mlp.c_fc.weight.exp_avg_sq"), "h.1.mlp.c_fc.weight");
  EXPECT_EQ(placement.parameter_of("master.wte.weight"), "wte.weight");
  EXPECT_EQ(placement.parameter_of("scaler.scale"), "");
  // A stage keeps its own parameters' state and the state of none; another stage's it leaves.
  EXPECT_TRUE(placement.keeps_state("optim.ln_f.weight.step"));
  EXPECT_TRUE(placement.keeps_state("scaler.growth_tracker"));
  EXPECT_FALSE(placement.keeps_state("optim.h.0.mlp.c_fc.weight.exp_avg"));

  // Without tensor parallelism a part is the whole, both ways, for parameters and their state.
  const at::Tensor t = torch::arange(12, torch::kFloat).view({3, 4});
  EXPECT_TRUE(placement.part("ln_f.weight", t).is_same(t));
  EXPECT_TRUE(placement.whole("ln_f.weight", t).is_same(t));
  EXPECT_EQ(placement.state_split_group("optim.ln_f.weight.exp_avg", t.sizes().vec()), nullptr);
  EXPECT_TRUE(placement.state_part("optim.ln_f.weight.exp_avg", t).is_same(t));
}

}  // namespace
}  // namespace tessera
