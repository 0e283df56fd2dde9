// The one layout validator (parallel/layout_check.h): every refusal names its keys, each
// component's check is reached through it, and layouts that compose are accepted. No processes:
// ParallelDims is arithmetic.
#include <gtest/gtest.h>

#include "core/parallel_dims.h"
#include "parallel/layout_check.h"
#include "plan/layout.h"
#include "test_util.h"
#include "tiny_config.h"

namespace tessera {
namespace {

Config tiny(const std::string& arch = "gpt") {
  Config c = test::tiny_config(/*seq_len=*/16, /*block_size=*/32);
  c.model.arch = arch;
  return c;
}

ParallelDims dims(const Config& c, int64_t world) { return ParallelDims(c.parallel, world, "test"); }

::testing::AssertionResult refused(const Config& c, int64_t world, std::initializer_list<std::string> parts) {
  return test::throws_naming([&] { check_parallel_layout(c, dims(c, world)); }, parts);
}

TEST(LayoutCheck, AcceptsLayoutsThatCompose) {
  Config c = tiny();
  EXPECT_NO_THROW(check_parallel_layout(c, dims(c, 1)));
  c.parallel.tp = 2;
  c.parallel.sp = 2;
  c.parallel.sp_method = "ulysses";  // 4 heads = 2 (tp) x 2 (sp)
  EXPECT_NO_THROW(check_parallel_layout(c, dims(c, 8)));
  // Tensor parallelism with every ZeRO stage and with offload (refused before parallelize()).
  for (int64_t stage : {0, 1, 2, 3}) {
    Config z = tiny();
    z.parallel.tp = 2;
    z.parallel.zero_stage = stage;
    z.parallel.offload = stage > 0;
    EXPECT_NO_THROW(check_parallel_layout(z, dims(z, 4))) << "zero_stage " << stage;
  }
  Config lasp = tiny("linear");
  lasp.parallel.sp = 4;
  lasp.parallel.sp_method = "lasp2";
  EXPECT_NO_THROW(check_parallel_layout(lasp, dims(lasp, 4)));
  // Dropout under tensor parallelism, with and without Megatron-SP (per-rank random streams,
  // refused before them), and under LASP.
  for (bool megatron_sp : {false, true}) {
    Config d = tiny();
    d.model.dropout = 0.1;
    d.parallel.tp = 2;
    d.parallel.megatron_sp = megatron_sp;
    EXPECT_NO_THROW(check_parallel_layout(d, dims(d, 4))) << "megatron_sp " << megatron_sp;
  }
  lasp.model.dropout = 0.1;
  EXPECT_NO_THROW(check_parallel_layout(lasp, dims(lasp, 4)));
}

// Names only their components know are checked against the components' own lists, with or without
// a pipeline or a data-parallel group to use them.
TEST(LayoutCheck, UnknownScheduleAndCompressorNamesAreRefusedWithTheKnownOnes) {
  Config c = tiny();
  c.parallel.pp_schedule = "zbh2";
  EXPECT_TRUE(refused(c, 1, {"parallel.pp_schedule", "\"zbh2\"", "1f1b", "dualpipev", "file:PATH"}));
  c = tiny();
  c.parallel.grad_compression = "gzip";
  EXPECT_TRUE(refused(c, 1, {"parallel.grad_compression", "\"gzip\"", "powersgd", "topk"}));
}

TEST(LayoutCheck, TensorParallelRefusalsNameTheirKeys) {
  Config c = tiny();
  c.parallel.tp = 4;
  c.model.n_head = 2;
  c.model.n_embd = 16;
  EXPECT_TRUE(refused(c, 4, {"model.n_head = 2", "parallel.tp = 4"}));
  // Key/value heads: a multiple of tp (split) or a divisor (replicated), nothing else.
  c = tiny();
  c.parallel.tp = 2;
  c.model.n_head = 6;
  c.model.n_embd = 48;
  c.model.n_kv_head = 3;
  EXPECT_TRUE(refused(c, 2, {"model.n_kv_head = 3", "neither a multiple nor a divisor", "parallel.tp = 2"}));
  c.model.n_kv_head = 1;
  EXPECT_NO_THROW(check_parallel_layout(c, dims(c, 2)));
  c = tiny();
  c.parallel.tp = 4;
  c.model.vocab_size = 66;
  c.model.vocab_multiple = 2;
  EXPECT_TRUE(refused(c, 4, {"model.vocab_size = 66", "model.vocab_multiple = 2", "parallel.tp = 4"}));
  c.model.vocab_multiple = 128;
  EXPECT_NO_THROW(check_parallel_layout(c, dims(c, 4)));  // 66 padded to 128 rows splits four ways
  c.model.vocab_size = 64;
  c.model.ffn = "moe";
  EXPECT_NO_THROW(check_parallel_layout(c, dims(c, 4)));  // MoE layers run whole on every tp rank
  c.parallel.megatron_sp = true;
  EXPECT_TRUE(refused(c, 4, {"parallel.megatron_sp = true with model.ffn = moe"}));
  c.parallel.megatron_sp = false;
  c.model.ffn = "dense";
  c.optim.name = "adafactor";
  EXPECT_TRUE(refused(c, 4, {"optim.name = adafactor", "parallel.tp = 4"}));
  c.optim.name = "adamw";
  c.parallel.megatron_sp = true;
  c.train.seq_len = 18;
  EXPECT_TRUE(refused(c, 4, {"train.seq_len = 18", "parallel.tp = 4", "megatron_sp"}));
  c.train.seq_len = 16;
  c.parallel.tp = 2;
  c.parallel.sp = 2;
  EXPECT_TRUE(refused(c, 4, {"parallel.megatron_sp", "parallel.sp = 2"}));
}

// Found trying the keys as a new user would: megatron_sp without tensor parallelism was accepted
// and ignored, and fp16 with offload on one process trained without master weights.
TEST(LayoutCheck, SilentAcceptancesAreRefused) {
  Config c = tiny();
  c.parallel.megatron_sp = true;
  EXPECT_TRUE(refused(c, 1, {"parallel.megatron_sp = true", "parallel.tp = 1"}));
  EXPECT_TRUE(refused(c, 2, {"parallel.megatron_sp = true", "parallel.tp = 1"}));
  c = tiny();
  c.precision.dtype = "fp16";
  c.parallel.zero_stage = 1;
  c.parallel.offload = true;
  EXPECT_TRUE(refused(c, 1, {"precision.dtype = \"fp16\"", "parallel.offload"}));
  c.parallel.offload = false;
  c.parallel.zero_stage = 0;
  EXPECT_TRUE(refused(c, 2, {"precision.dtype = \"fp16\"", "dp=2"}));
  c.parallel.tp = 2;
  EXPECT_TRUE(refused(c, 2, {"precision.dtype = \"fp16\"", "tp=2"}));
}

TEST(LayoutCheck, SequenceParallelRefusalsNameTheirKeys) {
  Config c = tiny();
  c.parallel.sp = 2;
  c.parallel.sp_method = "ulysses";
  c.model.n_head = 3;
  c.model.n_embd = 24;
  EXPECT_TRUE(refused(c, 2, {"model.n_head = 3", "parallel.sp * parallel.tp = 2"}));
  // Ulysses splits each rank's tensor-parallel heads again: n_head % (sp * tp), in one place.
  c = tiny();
  c.parallel.sp = 2;
  c.parallel.tp = 4;
  c.parallel.sp_method = "ulysses";
  EXPECT_TRUE(refused(c, 8, {"model.n_head = 4", "parallel.sp * parallel.tp = 8"}));
  c.parallel.sp_method = "ring";
  EXPECT_NO_THROW(check_parallel_layout(c, dims(c, 8)));
  c = tiny();
  c.parallel.sp = 2;
  c.model.dropout = 0.1;
  EXPECT_TRUE(refused(c, 2, {"model.dropout = 0.1", "parallel.sp = 2"}));
  c = tiny();
  c.parallel.sp = 2;
  c.parallel.sp_method = "lasp";
  EXPECT_TRUE(refused(c, 2, {"parallel.sp_method = \"lasp\"", "model.arch = gpt"}));
  c = tiny("linear");
  c.parallel.sp = 2;
  c.parallel.sp_method = "ring";
  EXPECT_TRUE(refused(c, 2, {"parallel.sp_method = \"ring\"", "model.arch = linear"}));
  c = tiny();
  c.parallel.sp = 3;
  EXPECT_TRUE(refused(c, 3, {"train.seq_len = 16", "parallel.sp = 3"}));
}

TEST(LayoutCheck, DataParallelAndUnbuiltDegreesNameTheirKeys) {
  Config c = tiny();
  c.parallel.offload = true;
  EXPECT_TRUE(refused(c, 2, {"parallel.offload = true", "parallel.zero_stage"}));
  c.parallel.zero_stage = 2;
  c.optim.name = "adafactor";
  EXPECT_TRUE(refused(c, 2, {"parallel.offload", "optim.name = adafactor"}));
  c = tiny();
  c.parallel.zero_stage = 1;
  c.parallel.grad_compression = "powersgd";
  EXPECT_TRUE(refused(c, 2, {"parallel.grad_compression = powersgd", "parallel.zero_stage = 0"}));
  c = tiny();
  c.parallel.pp = 2;
  c.parallel.grad_compression = "bf16";
  EXPECT_TRUE(refused(c, 4, {"parallel.pp > 1 with parallel.grad_compression = bf16"}));
  c.parallel.grad_compression = "none";
  c.precision.dtype = "fp16";
  EXPECT_TRUE(refused(c, 2, {"precision.dtype = \"fp16\" with parallel.pp > 1"}));
  c.precision.dtype = "fp32";
  c.parallel.pp = 3;
  EXPECT_TRUE(refused(c, 3, {"3 pipeline stages", "model.n_layer = 2"}));
  // Expert parallelism: refused by key before launch.
  c = tiny();
  c.parallel.ep = 2;
  EXPECT_TRUE(refused(c, 2, {"parallel.ep = 2 with model.ffn = dense"}));
  c.model.ffn = "moe";
  c.model.moe_experts = 3;
  EXPECT_TRUE(refused(c, 2, {"parallel.ep = 2 does not divide model.moe_experts = 3"}));
  c.model.moe_experts = 4;
  EXPECT_TRUE(refused(c, 3, {"parallel.ep = 2 must divide the data-parallel degree 3"}));
  c.parallel.grad_compression = "fp16";
  EXPECT_TRUE(refused(c, 2, {"parallel.grad_compression = fp16 with parallel.ep = 2"}));
  c.parallel.grad_compression = "none";
  c.memory.swap = true;
  EXPECT_TRUE(refused(c, 2, {"memory.swap = true with parallel.ep = 2"}));
  c.memory.swap = false;
  c.parallel.ep = 1;
  c.parallel.ep_dispatch = "hierarchical";
  EXPECT_TRUE(refused(c, 2, {"parallel.ep_dispatch = hierarchical with parallel.ep = 1"}));
  c.parallel.ep_dispatch = "nodes";
  EXPECT_TRUE(refused(c, 2, {"parallel.ep_dispatch must be alltoall or hierarchical"}));
  c.parallel.ep_dispatch = "alltoall";
  c.parallel.ep = 2;
  c.parallel.tp = 2;
  c.parallel.megatron_sp = true;
  EXPECT_TRUE(refused(c, 4, {"parallel.megatron_sp = true with model.ffn = moe"}));
}

// The start-up description names the expert dispatch and the nodes the ep group spans
// (parallel.ranks_per_node), and points an all-to-all over nodes at the hierarchical dispatch.
TEST(LayoutDescription, NamesTheExpertDispatchAndItsNodes) {
  Config c = tiny();
  c.model.ffn = "moe";
  c.parallel.ep = 4;
  c.parallel.ranks_per_node = 2;
  const ParallelDims d = dims(c, 4);
  const std::string all_to_all = describe_layout(c, make_layout(c, d));
  EXPECT_NE(all_to_all.find("expert dispatch: all-to-all over 4 ranks on 2 nodes"), std::string::npos) << all_to_all;
  EXPECT_NE(all_to_all.find("parallel.ep_dispatch = hierarchical"), std::string::npos) << all_to_all;
  c.parallel.ep_dispatch = "hierarchical";
  const std::string hierarchical = describe_layout(c, make_layout(c, d));
  EXPECT_NE(hierarchical.find("expert dispatch: hierarchical over 4 ranks on 2 nodes"), std::string::npos) << hierarchical;
  c.parallel.ranks_per_node = 4;
  const std::string one_node = describe_layout(c, make_layout(c, d));
  EXPECT_NE(one_node.find("over 4 ranks on 1 node "), std::string::npos) << one_node;
  c.parallel.ep = 1;
  c.parallel.ep_dispatch = "alltoall";
  EXPECT_EQ(describe_layout(c, make_layout(c, dims(c, 4))).find("expert dispatch"), std::string::npos);
}

}  // namespace
}  // namespace tessera
