// check_memory_fits: a run whose memory estimate cannot fit is refused before anything is
// allocated, on the CPU against the host's available memory (all ranks of the host together) and
// on a GPU against the device's memory (per rank), naming the largest term and its keys. It refuses
// by the estimate's certain terms (device_lower_bound_bytes), never by its approximate ones (the
// backward's working set, units in flight): a run between the two passes.
#include <gtest/gtest.h>

#include "model/transformer.h"
#include "parallel/tensor/tensor_parallel.h"
#include "plan/activation_estimate.h"
#include "plan/memory_estimate.h"
#include "test_util.h"
#include "config/config.h"

namespace tessera {
namespace {

Config gpt2_config(const std::string& device) {
  Config config = Config::load(test::source_path("configs/gpt2_124m.toml"), {"train.device=" + device});
  return config;
}

TEST(MemoryFits, CpuRunsAreCheckedAgainstTheHostForAllItsRanks) {
  const Config config = gpt2_config("cpu");
  const ParallelDims dims(config.parallel, 1, "test");
  const MemoryEstimate e = estimate_memory(config, make_layout(config, dims));
  const double one = e.device_lower_bound_bytes();
  ASSERT_GT(e.device_bytes(), one * 1.05);  // GPT-2's head: its logits' working set
  EXPECT_NO_THROW(check_memory_fits(config, e, 1, one * 1.01));
  EXPECT_TRUE(test::throws_naming([&] { check_memory_fits(config, e, 2, one * 1.5); },
                                  {"per rank x 2 ranks on this host", "available", "the largest term"}));
  EXPECT_NO_THROW(check_memory_fits(config, e, 1, 0));  // unknown: nothing refused
}

TEST(MemoryFits, GpuRunsAreCheckedAgainstTheDeviceMemoryPerRank) {
  const Config config = gpt2_config("cuda");
  const ParallelDims dims(config.parallel, 1, "test");
  const MemoryEstimate e = estimate_memory(config, make_layout(config, dims));
  const double one = e.device_lower_bound_bytes();
  // Eight ranks on the host do not add up on the GPU: each has its own device.
  EXPECT_NO_THROW(check_memory_fits(config, e, 8, one, one * 1.01));
  EXPECT_TRUE(test::throws_naming([&] { check_memory_fits(config, e, 1, 1e15, one * 0.9); },
                                  {"of GPU memory per rank", "train.device = cuda", "the largest term"}));
  EXPECT_NO_THROW(check_memory_fits(config, e, 1, 1e15, 0));
}

// memory.activation_compression scales the activations by what its encoding keeps per element:
// float32 -> bf16 halves, int8/fp8 keep 1 byte and a 4-byte scale per 32 of 4 (or 2 under bf16;
// the float32 residual stream that bf16 keeps on the CPU at 4).
TEST(MemoryFits, CompressedActivationsShrinkTheEstimateByTheirEncoding) {
  for (const std::string dtype : {"fp32", "bf16"}) {
    const Config plain = Config::load(test::source_path("configs/gpt2_124m.toml"), {"precision.dtype=" + dtype});
    const ParallelDims dims(plain.parallel, 1, "test");
    const double none = estimate_memory(plain, make_layout(plain, dims)).activation_bytes_per_token;
    auto with = [&](const std::string& codec) {
      Config c = plain;
      c.memory.activation_compression = codec;
      return estimate_memory(c, make_layout(c, dims)).activation_bytes_per_token;
    };
    const bool half = dtype == "bf16";
    // The norms' statistics and the attention's log-sum-exp stay float32, never encoded
    // (plan/activation_estimate.h): per block two LayerNorms' mean and rstd and one float per head.
    const double kept = static_cast<double>(plain.model.n_layer) * (16 + 4 * static_cast<double>(plain.model.n_head));
    // Under bf16 on the CPU the norms' inputs (the residual stream, 2h) are float32, the rest bf16.
    const double residual = half ? static_cast<double>(plain.model.n_layer) * 2 * static_cast<double>(plain.model.n_embd) * 4 : 0;
    const double encoded = none - kept - residual;  // at the compute dtype's bytes
    EXPECT_DOUBLE_EQ(with("lossless"), none);
    EXPECT_DOUBLE_EQ(with("bf16"), kept + residual / 2 + (half ? encoded : encoded / 2));
    EXPECT_DOUBLE_EQ(with("int8"), kept + residual * 1.125 / 4 + encoded * 1.125 / (half ? 2 : 4));
    EXPECT_DOUBLE_EQ(with("fp8"), with("int8"));
  }
}

// memory.activation_offload: the offloaded blocks' activations move to the host, two of them in
// flight stay on the device.
TEST(MemoryFits, OffloadedActivationsLeaveTwoBlocksInFlightOnTheDevice) {
  const Config plain = Config::load(test::source_path("configs/gpt2_124m.toml"), {});
  const ParallelDims dims(plain.parallel, 1, "test");
  const MemoryEstimate none = estimate_memory(plain, make_layout(plain, dims));
  const double block = none.activation_bytes_per_micro_batch / static_cast<double>(plain.model.n_layer);
  for (const int64_t offload : {1, 6, 12}) {
    Config c = plain;
    c.memory.activation_offload = offload;
    const MemoryEstimate e = estimate_memory(c, make_layout(c, dims));
    const double in_flight = static_cast<double>(std::min<int64_t>(offload, 2));
    EXPECT_NEAR(e.activation_bytes_per_micro_batch, block * (static_cast<double>(plain.model.n_layer - offload) + in_flight),
                1e-6 * block) << offload;
    EXPECT_NEAR(e.activation_host_bytes, block * static_cast<double>(offload), 1e-6 * block) << offload;
    EXPECT_NE(describe_memory_estimate(c, dims, e).find("memory.activation_offload = " + std::to_string(offload)),
              std::string::npos);
  }
}

// memory.resident_micro_batches: of what a pipeline rank's schedule holds, that many micro-batches
// (of a stage each) stay on the device and the rest wait on the host, 2 + v of their block groups
// in flight on the device for v stages a rank (the 2 + v set from this shape's run at micro-batches
// of 8 x 128 tokens, 48.3 MiB saved on rank 0; bench/results/pipeline_held_offload_cpu.md). The
// stages' outputs, held for every micro-batch until its backward, stay on the device.
TEST(MemoryFits, APipelineRanksHeldMicroBatchesBeyondTheResidentOnesAreOnTheHost) {
  Config plain = Config::load(test::source_path("configs/tiny_gpt.toml"),
                              {"model.n_layer=8", "parallel.pp=2", "parallel.pp_schedule=interleaved",
                               "train.grad_accum=8", "train.batch_size=2", "train.seq_len=64"});
  const ParallelDims dims(plain.parallel, 2, "test");
  const MemoryEstimate all = estimate_memory_by_rank(plain, make_layout(plain, dims)).front();
  ASSERT_EQ(all.pipeline_held, 5);  // micro-batches x one stage of two blocks, interleaved rank 0
  const double tokens = 2 * 64;
  const double block = block_activation_bytes_per_token(plain, dims, 0, activation_element_bytes(plain)) * tokens;
  const double outputs = pipeline_held_bytes_per_token(plain, dims).output * 5 * tokens;  // rank 0 holds no head
  EXPECT_NEAR(all.activation_bytes_per_micro_batch, block * 10 + outputs, 1e-6 * block);
  for (const int64_t resident : {1, 2, 5}) {
    Config c = plain;
    c.memory.resident_micro_batches = resident;
    const MemoryEstimate e = estimate_memory_by_rank(c, make_layout(c, dims)).front();
    const double on_host = static_cast<double>(5 - resident);
    EXPECT_NEAR(e.activation_bytes_per_micro_batch,
                block * (2 * static_cast<double>(resident) + (on_host > 0 ? 4 : 0)) + outputs, 1e-6 * block)
        << resident;
    EXPECT_NEAR(e.activation_host_bytes, block * 2 * on_host, 1e-6 * block) << resident;
  }
}

// Under GPipe each rank holds every micro-batch from its F to its B: rank 0 its blocks' saved
// activations and its stage's output (the backward's root), the head's rank its blocks' and the
// head's saved tensors for every micro-batch but the one whose backward the working set counts
// (pipeline_held_bytes_per_token; measured on bench/plan_memory_here.py's pp2 GPipe row).
TEST(MemoryFits, AGpipeRankHoldsEachMicroBatchsStageOutputOrItsHeadTensors) {
  const Config c = Config::load(test::source_path("configs/tiny_gpt.toml"),
                                {"model.n_layer=4", "parallel.pp=2", "parallel.pp_schedule=gpipe",
                                 "train.grad_accum=8", "train.batch_size=2", "train.seq_len=64"});
  const ParallelDims dims(c.parallel, 2, "test");
  const std::vector<MemoryEstimate> ranks = estimate_memory_by_rank(c, make_layout(c, dims));
  ASSERT_EQ(ranks.size(), 2u);
  ASSERT_EQ(ranks[0].pipeline_held, 8);
  ASSERT_EQ(ranks[1].pipeline_held, 8);
  const double tokens = 2 * 64;
  const double blocks = 2 * block_activation_bytes_per_token(c, dims, 0, activation_element_bytes(c)) * tokens;
  const PipelineHeld held = pipeline_held_bytes_per_token(c, dims);
  EXPECT_NEAR(held.output, 4.0 * c.model.n_embd, 1e-9);
  EXPECT_NEAR(held.head, 4.0 * (2 * c.model.n_embd + c.model.padded_vocab()), 1e-9);
  EXPECT_NEAR(ranks[0].activation_bytes_per_micro_batch, 8 * blocks + 8 * held.output * tokens, 1e-6 * blocks);
  EXPECT_NEAR(ranks[1].activation_bytes_per_micro_batch, 8 * blocks + 7 * held.head * tokens, 1e-6 * blocks);
}

// Under bf16 the products keep bf16 copies of their weights for the backward: on rank 0 of a
// GPipe pp2 run its blocks' linears, not the token embedding a lookup reads, the positions or the
// norms; on the head's rank its blocks' and the tied embedding the head multiplies by (found on
// bench/plan_memory_here.py's pp4 1F1B bf16 row). The pipeline step's micro-batches share one set
// (parallel/pipeline_step.h); under ZeRO-3 each held micro-batch keeps its own.
TEST(MemoryFits, Bf16CopiesAreOfTheParametersProductsUseOnceAStepOrPerHeldMicroBatchUnderZero3) {
  for (const int64_t zero : {0, 3}) {
    const Config c = Config::load(test::source_path("configs/tiny_gpt.toml"),
                                  {"model.n_layer=4", "parallel.pp=2", "parallel.pp_schedule=gpipe", "train.grad_accum=8",
                                   "train.batch_size=2", "train.seq_len=64", "precision.dtype=bf16",
                                   "parallel.dp=" + std::string(zero ? "2" : "1"), "parallel.zero_stage=" + std::to_string(zero)});
    const ParallelDims dims(c.parallel, zero ? 4 : 2, "test");
    const std::vector<MemoryEstimate> ranks = estimate_memory_by_rank(c, make_layout(c, dims));
    ASSERT_EQ(ranks.size(), 2u);  // by pipeline rank
    const double C = static_cast<double>(c.model.n_embd);
    // A GPT block's linears: c_attn (3C x C and 3C), c_proj (C x C and C), the MLP's 4C x C twice
    // and their biases (4C and C); its two LayerNorms (2 x 2C) are not copied.
    const double block = 3 * C * C + 3 * C + C * C + C + 2 * 4 * C * C + 4 * C + C;
    const double wte = static_cast<double>(c.model.padded_vocab()) * C;
    const double sets = zero ? 8 : 1;  // GPipe holds all 8 micro-batches
    EXPECT_NEAR(ranks[0].weight_copy_bytes, sets * 2 * (2 * block), 1e-6 * block) << "ZeRO-" << zero;
    EXPECT_NEAR(ranks[1].weight_copy_bytes, sets * 2 * (2 * block + wte), 1e-6 * block)
        << "ZeRO-" << zero;
  }
}

// A rank's parameters under tp are its shards' sizes as tensor parallelism cuts them, also where
// key/value heads are fewer than the ranks (Llama 3 8B's 8 at tp 16: each rank holds one whole).
TEST(MemoryFits, ATpRanksParametersAreItsShardsWithReplicatedKeyValueHeads) {
  Config c = Config::load(test::source_path("configs/gpt2_124m.toml"), {});
  c.model = ModelOptions::from_preset("llama3_8b");
  for (const int64_t tp : {4, 16}) {
    c.parallel.tp = tp;
    const ParallelDims dims(c.parallel, tp, "test");
    const MemoryEstimate e = estimate_memory(c, make_layout(c, dims));
    const TransformerLM whole(c.model, ModelStage{}, at::TensorOptions().device(at::kMeta));
    int64_t shards = 0;
    for (const auto& item : whole->named_parameters()) {
      const TensorParallelLayout layout = tensor_parallel_layout(whole->parameter_specs().at(item.key()), tp);
      shards += shard_tensor(item.value(), layout, 0, tp).numel();
    }
    EXPECT_EQ(e.parameters_rank, shards) << "tp " << tp;
  }
}

}  // namespace
}  // namespace tessera
