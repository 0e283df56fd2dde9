// The planner's prices of work beside the device: ZeRO-Offload's copies and host step, a swapped
// layout's step as the swap engine's own replay of the predicted blocks, an ATOM swarm's rounds
// (batch and DiLoCo), and the search planning each only where the cluster file prices it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "memory/swap/swap_simulate.h"
#include "parallel/layout_check.h"
#include "plan/cluster.h"
#include "plan/activation_estimate.h"
#include "plan/activation_policy.h"
#include "plan/layout.h"
#include "plan/cost_model.h"
#include "plan/search.h"
#include "plan/swap_cost.h"
#include "plan/swap_policy.h"
#include "plan/swarm_cost.h"
#include "plan_test_util.h"
#include "test_util.h"

namespace tessera {
namespace {

using plan::Cluster;

// The planner tests' cluster (plan_test_util.h) with a host and the peers' link.
std::string cluster_text(double memory_gib = 16, double device_link_gbs = 20, bool peers = true) {
  char memory[64], host[256];
  std::snprintf(memory, sizeof memory, "memory_gib = %.9g", memory_gib);
  std::snprintf(host, sizeof host, "[host]\nmemory_gib = 512\ndevice_link_gbs = %g\noptimizer_gbs = 30\n", device_link_gbs);
  return test::replaced_text(test::kPlannerCluster, "memory_gib = 16", memory) + host +
         (peers ? "[peers]\nbandwidth_gbs = 0.1\nlatency_us = 300\nround_overhead_ms = 40\n" : "");
}

Cluster host_cluster(double memory_gib = 16, double device_link_gbs = 20, bool peers = true) {
  return plan::parse_cluster(cluster_text(memory_gib, device_link_gbs, peers), "host.toml");
}

// Wider blocks over fewer tokens, so weights, not activations, fill a small device budget.
Config swap_config() {
  Config c = test::planner_config();
  c.model.n_embd = 256;
  c.model.block_size = c.train.seq_len = 16;
  c.train.batch_size = 1;
  c.memory.swap = true;
  c.memory.device_budget_gb = 0.012;
  return c;
}

// Weight elements of the whole model, as the operations declare them.
double elements(const Config& c, const ParallelDims& dims, const Cluster& cluster) {
  return plan::price_operations(c, dims, cluster).total().parameters;
}

// ZeRO-1 over 2 replicas with offload: the host steps the shard (AdamW's 28 bytes per element and
// the clipping norm's 4 at host.optimizer_gbs) and the shard's gradients go down and its masters
// come back over the host link, in full at stage 1; at stage 2 the gradients' copy hides behind the
// backward. The compute is unchanged.
TEST(HostCosts, OffloadMovesTheOptimizerStepToTheHostWithItsCopies) {
  const Cluster cluster = host_cluster();
  Config c = test::planner_config();
  c.parallel.zero_stage = 1;
  const ParallelDims dims(c.parallel, 2, "test");
  const plan::Prediction resident = plan::predict_time(c, dims, cluster);
  c.parallel.offload = true;
  const plan::Prediction offloaded = plan::predict_time(c, dims, cluster);
  const double shard = elements(c, dims, cluster) / 2;
  EXPECT_NEAR(test::breakdown_term(offloaded, "optimizer"), shard * 32 / 30e9, 1e-15);
  EXPECT_NEAR(test::breakdown_term(offloaded, "offload_copies"), 2 * shard * 4 / 20e9, 1e-15);
  EXPECT_NEAR(test::breakdown_sum(offloaded), offloaded.step_s, 1e-12);
  EXPECT_NEAR(test::breakdown_term(offloaded, "products"), test::breakdown_term(resident, "products"), 1e-15);
  EXPECT_EQ(test::breakdown_term(resident, "offload_copies"), 0);

  c.parallel.zero_stage = 2;
  const plan::Prediction stage2 = plan::predict_time(c, dims, cluster);
  EXPECT_LT(test::breakdown_term(stage2, "offload_copies"), test::breakdown_term(offloaded, "offload_copies"));
  EXPECT_GE(test::breakdown_term(stage2, "offload_copies"), shard * 4 / 20e9);  // the masters' copy back is never hidden

  const Cluster no_host = plan::parse_cluster(test::replaced_text(cluster_text(), "optimizer_gbs = 30", ""), "nohost.toml");
  EXPECT_TRUE(test::throws_naming([&] { plan::predict_time(c, dims, no_host); }, {"nohost.toml", "host.optimizer_gbs"}));
}

// memory.activation_offload = 2 of 4 blocks: each offloaded block's saved activations go to the
// host and back over host.device_link_gbs beside its compute; what its forward and backward do not
// hide is added to its input gradient (plan/activation_policy.h, offload_copy_seconds), so a link
// fast enough costs nothing and a slow one the copies' excess, by hand. The blocks not offloaded, the
// products and the breakdown's sum are unchanged; the memory estimate holds two groups in flight.
TEST(HostCosts, ActivationOffloadCostsTheCopiesItsBlocksDoNotHide) {
  Config c = test::planner_config();
  const ParallelDims dims(c.parallel, 1, "test");
  const Cluster fast = host_cluster(16, 1e6);  // 1 PB/s: every copy hidden
  const plan::Prediction resident = plan::predict_time(c, dims, fast);
  const plan::PricedOperations priced = plan::price_operations(c, dims, fast);
  c.memory.activation_offload = 2;
  EXPECT_NEAR(plan::predict_time(c, dims, fast).step_s, resident.step_s, 1e-15) << "hidden by the fast link";

  const double link_gbs = 1e-3;  // 1 MB/s: every copy exposed
  const Cluster slow = host_cluster(16, link_gbs);
  const plan::Prediction slow_resident = plan::predict_time(test::planner_config(), dims, slow);
  const plan::Prediction offloaded = plan::predict_time(c, dims, slow);
  const plan::PricedOperations slow_priced = plan::price_operations(c, dims, slow);
  double expected = 0;
  for (int64_t l = 0; l < 2; ++l) {
    const plan::PartCost& before = priced.blocks[static_cast<size_t>(l)];
    const double one_way = block_activation_bytes(c, dims, l) / (link_gbs * 1e9);
    const double copies = std::max(0.0, one_way - before.i - before.w) + std::max(0.0, one_way - before.f);
    EXPECT_NEAR(slow_priced.blocks[static_cast<size_t>(l)].offload, copies, 1e-12) << "block " << l;
    expected += copies;
  }
  EXPECT_GT(expected, 0);
  EXPECT_EQ(slow_priced.blocks[2].offload, 0);
  const double m = static_cast<double>(offloaded.micro_batches);
  EXPECT_NEAR(test::breakdown_term(offloaded, "activation_offload_copies"), m * expected, 1e-9);
  EXPECT_NEAR(offloaded.step_s - slow_resident.step_s, m * expected, 1e-9);
  EXPECT_NEAR(test::breakdown_sum(offloaded), offloaded.step_s, 1e-9);
  EXPECT_NEAR(test::breakdown_term(offloaded, "products"), test::breakdown_term(slow_resident, "products"), 1e-15);

  const Cluster no_link = host_cluster(16, 0);
  EXPECT_TRUE(test::throws_naming([&] { plan::predict_time(c, dims, no_link); }, {"host.toml", "host.device_link_gbs"}));
}

// memory.resident_micro_batches: each block's held micro-batches pay the same copies as an
// offloaded block's, for the forwards its rank's row offloads (pipeline::held_offloaded_forwards):
// 1F1B over four ranks of one block and eight micro-batches, rank 0 offloads six; over a slow link
// it is the critical rank, and the breakdown still adds up to the step.
TEST(HostCosts, HeldMicroBatchesPayTheCopiesOfTheForwardsTheirRankOffloads) {
  Config c = test::planner_config();
  c.parallel.pp = 4;
  c.train.grad_accum = 8;
  const ParallelDims dims(c.parallel, 4, "test");
  const double link_gbs = 1e-3;  // 1 MB/s: every copy exposed
  const Cluster slow = host_cluster(16, link_gbs);
  const plan::Prediction resident = plan::predict_time(c, dims, slow);
  c.memory.resident_micro_batches = 1;
  const plan::PricedOperations priced = plan::price_operations(c, dims, slow);
  for (int64_t l = 0; l < c.model.n_layer; ++l) {
    const plan::PartCost& b = priced.blocks[static_cast<size_t>(l)];
    const double one_way = block_activation_bytes(c, dims, l) / (link_gbs * 1e9);
    EXPECT_NEAR(b.held_offload, std::max(0.0, one_way - b.i - b.w) + std::max(0.0, one_way - b.f), 1e-12) << l;
    EXPECT_EQ(b.offload, 0) << l;
  }
  const plan::Prediction held = plan::predict_time(c, dims, slow);
  EXPECT_NEAR(test::breakdown_term(held, "activation_offload_copies"), 6 * priced.blocks[0].held_offload, 1e-9);
  EXPECT_GT(held.step_s, resident.step_s);
  EXPECT_NEAR(test::breakdown_sum(held), held.step_s, 1e-9);
}

// memory.activation_compression: each block's encoding and decoding at the codec's calibrated rate
// (device.activation_codec_*_gbs, float32 source bytes per second), per element of what the block
// saves less its float32 statistics, half in the forward and half in the backward, by hand.
// Everything else is unchanged; the memory estimate holds the encoded bytes; a cluster file
// without the codec's rate refuses it by key; lossless costs nothing; the attention core's own
// codec (memory.attention_compression) is priced at its rate.
TEST(HostCosts, ActivationCompressionCostsItsCodecsCalibratedRate) {
  Config c = test::planner_config();
  const ParallelDims dims(c.parallel, 1, "test");
  const Cluster cluster = plan::parse_cluster(
      test::replaced_text(cluster_text(), "memory_gbs = 1000",
                          "memory_gbs = 1000\nactivation_codec_int8_gbs = 2\nactivation_codec_int4_gbs = 3\n"
                          "activation_codec_bf16_gbs = 8"),
      "codecs.toml");
  const plan::Prediction plain = plan::predict(c, dims, cluster);
  const double slowdown = plan::price_operations(c, dims, cluster).memory_slowdown;
  double source = 0;  // float32 bytes
  for (int64_t l = 0; l < c.model.n_layer; ++l)
    source += block_activation_bytes(c, dims, l) - block_statistics_bytes(c, dims);
  const double m = static_cast<double>(plain.micro_batches);
  for (const auto& [codec, gbs] : std::vector<std::pair<std::string, double>>{{"int8", 2}, {"int4", 3}, {"bf16", 8}}) {
    Config coded = c;
    coded.memory.activation_compression = codec;
    const plan::Prediction p = plan::predict(coded, dims, cluster);
    const double expected = m * source * slowdown / (gbs * 1e9);
    EXPECT_GT(expected, 0);
    EXPECT_NEAR(p.step_s - plain.step_s, expected, 1e-9 * plain.step_s) << codec;
    EXPECT_NEAR(test::breakdown_term(p, "memory_bound") - test::breakdown_term(plain, "memory_bound"), expected,
                1e-9 * plain.step_s) << codec;
    EXPECT_NEAR(test::breakdown_term(p, "products"), test::breakdown_term(plain, "products"), 1e-15) << codec;
    EXPECT_NEAR(test::breakdown_sum(p), p.step_s, 1e-9 * p.step_s) << codec;
    EXPECT_LT(p.peak_memory_bytes, plain.peak_memory_bytes) << codec;
  }
  // memory.attention_compression: the attention core's elements at its codec's rate, the rest at
  // the block's; and the core alone encoded under a block that encodes nothing.
  const AttentionCoreElements core = attention_core_elements_per_token(c, dims, ActivationCodec::int8);
  const double core_source = m * (core.compute * compute_element_bytes(c) + 4 * core.float32) *
                             static_cast<double>(c.train.batch_size * c.train.seq_len) * static_cast<double>(c.model.n_layer);
  ASSERT_GT(core_source, 0);
  for (const auto& [codec, gbs] : std::vector<std::pair<std::string, double>>{{"int4", 3}, {"none", 0}}) {
    Config coded = c;
    coded.memory.activation_compression = codec;
    coded.memory.attention_compression = "int8";
    const double expected =
        (gbs > 0 ? (m * source - core_source) * slowdown / (gbs * 1e9) : 0) + core_source * slowdown / (2 * 1e9);
    EXPECT_NEAR(plan::predict(coded, dims, cluster).step_s - plain.step_s, expected, 1e-9 * plain.step_s) << codec;
  }
  Config fp8 = c;
  fp8.memory.activation_compression = "fp8";
  EXPECT_TRUE(test::throws_naming([&] { plan::predict(fp8, dims, cluster); },
                                  {"codecs.toml", "device.activation_codec_fp8_gbs"}));
  Config lossless = c;
  lossless.memory.activation_compression = "lossless";
  EXPECT_NEAR(plan::predict(lossless, dims, cluster).step_s, plain.step_s, 1e-15);
}

// memory.activation_policy = auto: the run's own policy chooses each block's option from the
// predicted blocks; the step is the resident one plus each micro-batch's chosen seconds (in I and
// in the breakdown's activation_policy term), and the peak is the model state plus the policy's
// bytes, within the budget. A budget leaving half of what keeping every block needs must save.
TEST(HostCosts, TheActivationPolicyIsTheRunsChoiceOnThePredictedBlocks) {
  Config c = test::planner_config();
  const ParallelDims dims(c.parallel, 1, "test");
  const Cluster cluster = host_cluster();
  const plan::Prediction resident = plan::predict(c, dims, cluster);
  c.memory.activation_policy = "auto";
  c.memory.device_budget_gb = 1;
  const double gib = 1024.0 * 1024.0 * 1024.0;
  const double state = gib - activation_shares(c, make_layout(c, dims)).at(0).budget_bytes;
  double keep = 0;
  for (int64_t l = 0; l < c.model.n_layer; ++l) keep += block_activation_bytes(c, dims, l);
  c.memory.device_budget_gb = (state + keep / 2) / gib;
  const plan::PricedOperations priced = plan::price_operations(c, dims, cluster);
  ASSERT_EQ(priced.activation_policies.size(), 1u);
  const ActivationPolicy& policy = priced.activation_policies[0];
  EXPECT_GT(policy.seconds, 0) << describe_activation_policy(policy);
  const plan::Prediction p = plan::predict(c, dims, cluster);
  const double m = static_cast<double>(p.micro_batches);
  EXPECT_NEAR(p.step_s - resident.step_s, m * policy.seconds, 1e-9 * p.step_s);
  EXPECT_NEAR(test::breakdown_term(p, "activation_policy"), m * policy.seconds, 1e-9 * p.step_s);
  EXPECT_NEAR(test::breakdown_sum(p), p.step_s, 1e-9 * p.step_s);
  EXPECT_NEAR(p.peak_memory_bytes, state + policy.bytes, 1e-6 * p.peak_memory_bytes);
  EXPECT_LE(p.peak_memory_bytes, c.memory.device_budget_gb * gib);
  EXPECT_LT(p.peak_memory_bytes, resident.peak_memory_bytes);
}

// The same under a pipeline: each rank's policy, from the predicted blocks cut as the run's
// profile would cut them (it once failed there: the predicted costs had no block times to cut
// by). Rank 0 of two, holding two micro-batches in 2.5 blocks' worth of its two blocks' four.
TEST(HostCosts, EachPipelineRankChoosesItsPolicyFromThePredictedBlocks) {
  Config c = test::planner_config();
  c.parallel.pp = 2;
  const ParallelDims dims(c.parallel, 2, "test");
  const Cluster cluster = host_cluster();
  c.memory.activation_policy = "auto";
  c.memory.device_budget_gb = 1;
  const double gib = 1024.0 * 1024.0 * 1024.0;
  double state = 0;
  for (const ActivationShare& share : activation_shares(c, make_layout(c, dims)))
    state = std::max(state, gib - share.budget_bytes);
  c.memory.device_budget_gb = (state + 2.5 * block_activation_bytes(c, dims, 0)) / gib;
  const plan::PricedOperations priced = plan::price_operations(c, dims, cluster);
  ASSERT_EQ(priced.activation_policies.size(), 2u);
  EXPECT_GT(priced.activation_policies[0].seconds, 0) << describe_activation_policy(priced.activation_policies[0]);
  for (const ActivationPolicy& policy : priced.activation_policies)
    EXPECT_LE(policy.bytes, policy.budget_bytes) << describe_activation_policy(policy);
  const plan::Prediction p = plan::predict(c, dims, cluster);
  EXPECT_NEAR(test::breakdown_sum(p), p.step_s, 1e-9 * p.step_s);
}

// A swapped layout: the swap plan the run would make from the predicted blocks (their forward and
// backward summing to the resident micro-batch's, their updates at the host's rate), and the step
// the swap engine's simulator replays for it; a slower link costs more.
TEST(HostCosts, ASwappedStepIsTheSwapEnginesReplayOfThePredictedBlocks) {
  const Cluster cluster = host_cluster(16, 0.05);
  Config c = swap_config();
  c.check("test");
  const ParallelDims one(c.parallel, 1, "test");
  const plan::PricedOperations priced = plan::price_operations(c, one, cluster);
  const plan::SwapStep swapped = plan::predict_swap_step(c, one, cluster, priced);
  ASSERT_GT(swapped.plan.size(), 1);  // the budget cuts the model
  double forward = 0, backward = 0, optim = swapped.plan.ends.optim_s;
  for (const swap::SubModel& s : swapped.plan.subs) forward += s.forward_s, backward += s.backward_s, optim += s.optim_s;
  const plan::PartCost all = priced.total();
  EXPECT_NEAR(forward, all.f, 1e-12 * all.f);
  EXPECT_NEAR(backward, all.i + all.w, 1e-12 * backward);
  EXPECT_NEAR(optim, elements(c, one, cluster) * 28 / 30e9, 1e-15);  // fp32: no bf16 copies to refresh
  EXPECT_EQ(swapped.plan.micro_batches, 4);
  EXPECT_DOUBLE_EQ(swapped.step_s, swap::simulate_swap_plan(swapped.plan).step_time);

  const plan::Prediction p = plan::predict(c, one, cluster);
  EXPECT_DOUBLE_EQ(p.step_s, swapped.step_s);
  EXPECT_NEAR(test::breakdown_sum(p), p.step_s, 1e-12);
  EXPECT_GT(test::breakdown_term(p, "swap_link_and_host"), 0);
  EXPECT_DOUBLE_EQ(p.peak_memory_bytes, swapped.peak_device_bytes);
  EXPECT_LE(plan::step_lower_bound(c, one, cluster, priced), p.step_s);
  const Cluster slower = host_cluster(16, 0.005);
  EXPECT_GT(plan::predict_time(c, one, slower).step_s, p.step_s);
}

// Full checkpointing chosen by hand under swap: the plan keeps the largest block's whole activations
// out of the budget, as its backward's recomputation holds them beside the sub-models (the policy
// reserves the same for the blocks it recomputes).
TEST(HostCosts, ASwappedHandMadeFullCheckpointingReservesTheBlockItRecomputes) {
  const Cluster cluster = host_cluster(16, 0.05);
  Config c = swap_config();
  c.memory.activation_checkpointing = "full";
  c.check("test");
  const ParallelDims one(c.parallel, 1, "test");
  double whole = 0;
  for (int64_t l = 0; l < c.model.n_layer; ++l) whole = std::max(whole, recomputed_block_bytes(c, one, l));
  EXPECT_GT(whole, block_activation_bytes(c, one, 0));
  const plan::SwapStep swapped = plan::predict_swap_step(c, one, cluster, plan::price_operations(c, one, cluster));
  EXPECT_DOUBLE_EQ(swapped.plan.device_budget_bytes, c.memory.device_budget_gb * 1024.0 * 1024.0 * 1024.0 - whole);
  c.memory.activation_checkpointing = "none";
  const plan::SwapStep kept = plan::predict_swap_step(c, one, cluster, plan::price_operations(c, one, cluster));
  EXPECT_DOUBLE_EQ(kept.plan.device_budget_bytes, c.memory.device_budget_gb * 1024.0 * 1024.0 * 1024.0);
}

// Swapped under memory.activation_policy = auto: the policy is chosen with the swap plan from the
// predicted blocks (plan/swap_policy.h), the same choice a run makes from costs measured as
// predicted; the step is that plan's replay, the policy's seconds its own term, the parts summing
// to the step, the plan's peak within the budget. This budget keeps every block; the first smaller
// one (by 0.8x) whose plan cannot recomputes or offloads some, at a longer step.
TEST(HostCosts, SwappedTheActivationPolicyIsChosenWithThePlan) {
  const Cluster cluster = host_cluster(16, 0.05);
  Config c = swap_config();
  c.memory.activation_policy = "auto";
  c.check("test");
  const ParallelDims one(c.parallel, 1, "test");
  const plan::PricedOperations priced = plan::price_operations(c, one, cluster);
  EXPECT_TRUE(priced.activation_policies.empty());  // chosen with the plan, not from a share
  const plan::SwapStep swapped = plan::predict_swap_step(c, one, cluster, priced);
  ASSERT_TRUE(swapped.activation_policy.has_value());
  const plan::Prediction p = plan::predict(c, one, cluster);
  ASSERT_EQ(p.activation_policies.size(), 1u);
  EXPECT_DOUBLE_EQ(p.step_s, swapped.step_s);
  EXPECT_NEAR(test::breakdown_sum(p), p.step_s, 1e-12);
  double seconds = 0;
  for (const ActivationOption& o : swapped.activation_policy->blocks) seconds += o.seconds;
  EXPECT_NEAR(test::breakdown_term(p, "activation_policy"), static_cast<double>(p.micro_batches) * seconds, 1e-12);
  EXPECT_LE(swap::occupancy(swapped.plan).peak, swapped.plan.device_budget_bytes);
  auto keeps_all = [](const ActivationPolicy& policy) {
    return std::all_of(policy.blocks.begin(), policy.blocks.end(), [](const ActivationOption& o) { return o.name() == "keep"; });
  };
  EXPECT_TRUE(keeps_all(*swapped.activation_policy));
  // Smaller budgets: the first whose plan cannot keep every block recomputes or offloads some, and
  // its plan fits.
  bool squeezed = false;
  for (int64_t i = 1; i <= 16 && !squeezed; ++i) {
    Config tight = c;
    tight.memory.device_budget_gb = c.memory.device_budget_gb * std::pow(0.8, static_cast<double>(i));
    try {
      const plan::SwapStep s = plan::predict_swap_step(tight, one, cluster, plan::price_operations(tight, one, cluster));
      if (keeps_all(*s.activation_policy)) continue;
      squeezed = true;
      EXPECT_LE(swap::occupancy(s.plan).peak, s.plan.device_budget_bytes);
      EXPECT_GT(s.step_s, swapped.step_s);
    } catch (const Error& e) {
      ADD_FAILURE() << "budget " << tight.memory.device_budget_gb << " refused before any block was squeezed: " << e.what();
      break;
    }
  }
  EXPECT_TRUE(squeezed);
}

// Batch mode: each of 4 peers computes its share of the target (16 = 4 peers x 2 micro-batches of
// 2), then one butterfly round of the float32 gradients (2 (n-1)/n x bytes / bandwidth, two
// latencies and the round's fixed cost). DiLoCo: a local step and a tenth of a round of int8
// pseudo-gradients (top-k: a quarter of the entries, each with its 2-byte index) and of the outer
// step (24 bytes per element on the host).
TEST(SwarmCosts, ABatchRoundIsTheButterflyAndDiLoCoAmortisesItsRound) {
  const Cluster cluster = host_cluster();
  Config c = test::planner_config();
  c.swarm.sync = "batch";
  c.swarm.overlap_rounds = "never";  // rounds after the backward (overlapped: the test below)
  c.swarm.mean_all_reduce = "butterfly";  // round a ring: below
  c.swarm.target_batch_size = 16;
  const ParallelDims one(plan::peer_config(c, 4).parallel, 1, "test");
  const double P = elements(c, one, cluster);
  auto round = [&](double bytes) { return 2 * 0.75 * bytes / 0.1e9 + 2 * 300e-6 + 40e-3; };

  const plan::Prediction batch = plan::predict_swarm(c, 4, cluster);
  const plan::Prediction local = plan::predict_time(plan::peer_config(c, 4), one, cluster);
  EXPECT_EQ(local.micro_batches, 2);
  EXPECT_NEAR(batch.step_s - local.step_s, round(4 * P), 1e-12);
  EXPECT_NEAR(test::breakdown_term(batch, "swarm_round"), round(4 * P), 1e-12);
  EXPECT_NEAR(batch.tokens_per_s, 16 * 64 / batch.step_s, 1e-6);
  EXPECT_NEAR(test::breakdown_sum(batch), batch.step_s, 1e-12);
  // Round a ring (the default): the same bytes in 2 (n - 1) = 6 steps.
  Config ring = c;
  ring.swarm.mean_all_reduce = "ring";
  EXPECT_NEAR(test::breakdown_term(plan::predict_swarm(ring, 4, cluster), "swarm_round"), round(4 * P) + 4 * 300e-6,
              1e-12);

  c.swarm.sync = "diloco";
  c.swarm.inner_steps = 10;
  c.swarm.pseudo_gradient_dtype = "int8";
  c.train.grad_accum = 2;
  const plan::Prediction diloco = plan::predict_swarm(c, 4, cluster);
  const plan::Prediction inner = plan::predict_time(plan::peer_config(c, 4), one, cluster);
  EXPECT_NEAR(diloco.step_s - inner.step_s, round(P) / 10 + 24 * P / 30e9 / 10, 1e-12);
  EXPECT_NEAR(diloco.tokens_per_s, 4 * 2 * 2 * 64 / diloco.step_s, 1e-6);
  c.swarm.topk_ratio = 0.25;
  const plan::Prediction sparse = plan::predict_swarm(c, 4, cluster);
  EXPECT_NEAR(test::breakdown_term(sparse, "swarm_round"), round(0.25 * 3 * P) / 10, 1e-12);

  c.swarm.pseudo_gradient_rank = 4;
  c.swarm.topk_ratio = 1;
  EXPECT_TRUE(test::throws_naming([&] { plan::predict_swarm(c, 4, cluster); }, {"swarm.pseudo_gradient_rank"}));
  c.swarm.pseudo_gradient_rank = 0;
  EXPECT_TRUE(test::throws_naming([&] { plan::predict_swarm(c, 4, host_cluster(16, 20, false)); },
                                  {"host.toml", "peers.bandwidth_gbs"}));
}

// Overlapped batch rounds (swarm.overlap_rounds = always, the default): the step's last backward
// hides the round's transfer but its last row of pieces; its latencies and fixed cost stay. Not
// where the peer has no gradient leaves (fp16, memory.swap). The link's time hides on a CPU whose
// every core computes too (unlike a collective's copies).
TEST(SwarmCosts, AnOverlappedBatchRoundHidesBehindTheLastBackwardButItsLastRow) {
  const Cluster cluster = host_cluster();
  Config c = test::planner_config();
  c.swarm.sync = "batch";
  c.swarm.mean_all_reduce = "butterfly";
  c.swarm.target_batch_size = 16;
  ASSERT_EQ(c.swarm.overlap_rounds, "always");
  const ParallelDims one(plan::peer_config(c, 4).parallel, 1, "test");
  const double P = elements(c, one, cluster);
  const double transfer = 2 * 0.75 * 4 * P / 0.1e9, fixed = 2 * 300e-6 + 40e-3;
  const plan::PartCost all = plan::price_operations(plan::peer_config(c, 4), one, cluster).total();
  ASSERT_GT(all.i + all.w, 0);
  const plan::Prediction overlapped = plan::predict_swarm(c, 4, cluster);
  EXPECT_NEAR(test::breakdown_term(overlapped, "swarm_round"),
              std::max(0.0, transfer * 15 / 16 - (all.i + all.w)) + transfer / 16 + fixed, 1e-12);
  EXPECT_LT(test::breakdown_term(overlapped, "swarm_round"), transfer + fixed);
  EXPECT_NEAR(test::breakdown_sum(overlapped), overlapped.step_s, 1e-12);
  // After the backward: fp16 peers and swapped peers.
  Config fp16 = c;
  fp16.precision.dtype = "fp16";
  EXPECT_NEAR(test::breakdown_term(plan::predict_swarm(fp16, 4, cluster), "swarm_round"), transfer + fixed, 1e-12);
  EXPECT_FALSE(plan::rounds_overlap(fp16));
  Config swapped = c;
  swapped.memory.swap = true;
  EXPECT_FALSE(plan::rounds_overlap(swapped));
  // Four peers on a CPU node of four cores, every core computing: the link's time still hides.
  const Cluster cpu = plan::parse_cluster(
      test::replaced_text(cluster_text(), "[device]\n", "[device]\nkind = \"cpu\"\n"), "cpu.toml");
  ASSERT_EQ(cpu.device.kind, "cpu");
  plan::CostOptions sharing;
  sharing.busy_ranks = 4;  // the peers' products slow down too
  const plan::PartCost on_cpu = plan::price_operations(plan::peer_config(c, 4), one, cpu, sharing).total();
  EXPECT_NEAR(test::breakdown_term(plan::predict_swarm(c, 4, cpu), "swarm_round"),
              std::max(0.0, transfer * 15 / 16 - (on_cpu.i + on_cpu.w)) + transfer / 16 + fixed, 1e-12);
}

// A round's CPU ([peers] cpu_ns_per_byte, one byte's whole cost per byte a peer sends): on a GPU's
// host it bounds the round's transfer from below (after the backward, overlapped, DiLoCo's); on a
// CPU device it runs on the compute's cores, stretched by the node's sharing: an overlapped round
// adds it beside the backward (swarm_round_cpu), a round after the backward takes at least it.
TEST(SwarmCosts, ARoundsCpuBoundsItsTransferAndOnACpuDeviceJoinsTheBackward) {
  auto priced = [](const std::string& kind, double ns_per_byte) {
    std::string text = test::replaced_text(cluster_text(), "round_overhead_ms = 40",
                                           "round_overhead_ms = 40\ncpu_ns_per_byte = " + std::to_string(ns_per_byte));
    if (kind == "cpu")
      text = test::replaced_text(test::replaced_text(text, "[device]\n", "[device]\nkind = \"cpu\"\n"),
                                 "devices_per_node = 4", "devices_per_node = 4\nshared_slowdown = 3");
    return plan::parse_cluster(text, kind + ".toml");
  };
  Config c = test::planner_config();
  c.swarm.sync = "batch";
  c.swarm.mean_all_reduce = "butterfly";
  c.swarm.target_batch_size = 16;
  const ParallelDims one(plan::peer_config(c, 4).parallel, 1, "test");
  const Cluster plain = host_cluster();
  const double P = elements(c, one, plain);
  const double sent = 2 * 0.75 * 4 * P, transfer = sent / 0.1e9, fixed = 2 * 300e-6 + 40e-3;
  Config after = c;
  after.swarm.overlap_rounds = "never";

  // A GPU's host: 1 ns a byte is cheaper than the 10 ns of the 0.1 GB/s link, 50 ns dearer.
  const Cluster cheap = priced("gpu", 1), dear = priced("gpu", 50);
  EXPECT_NEAR(plan::round_cpu(4 * P, 4, dear).seconds, 50e-9 * sent, 1e-15);
  EXPECT_FALSE(plan::round_cpu(4 * P, 4, dear).on_compute_cores);
  EXPECT_NEAR(plan::predict_swarm(after, 4, cheap).step_s, plan::predict_swarm(after, 4, plain).step_s, 1e-12);
  EXPECT_NEAR(test::breakdown_term(plan::predict_swarm(after, 4, dear), "swarm_round"), 50e-9 * sent + fixed, 1e-12);
  const plan::PartCost all = plan::price_operations(plan::peer_config(c, 4), one, dear).total();
  const plan::Prediction overlapped = plan::predict_swarm(c, 4, dear);
  EXPECT_NEAR(test::breakdown_term(overlapped, "swarm_round"),
              std::max(0.0, 50e-9 * sent * 15 / 16 - (all.i + all.w)) + 50e-9 * sent / 16 + fixed, 1e-12);
  EXPECT_EQ(test::breakdown_term(overlapped, "swarm_round_cpu"), 0);

  // A CPU device, four peers on a node of four sharing at 3x: 1 ns a byte takes 3 ns of each
  // peer's time. Beside an overlapped round's backward it adds that, and widens what hides the link.
  const Cluster cpu = priced("cpu", 1);
  const double cpu_s = 3 * 1e-9 * sent;
  EXPECT_NEAR(plan::round_cpu(4 * P, 4, cpu).seconds, cpu_s, 1e-15);
  EXPECT_TRUE(plan::round_cpu(4 * P, 4, cpu).on_compute_cores);
  plan::CostOptions sharing;
  sharing.busy_ranks = 4;  // the peers' products slow down too
  const plan::PartCost on_cpu = plan::price_operations(plan::peer_config(c, 4), one, cpu, sharing).total();
  const plan::Prediction joined = plan::predict_swarm(c, 4, cpu);
  EXPECT_NEAR(test::breakdown_term(joined, "swarm_round_cpu"), cpu_s, 1e-15);
  EXPECT_NEAR(test::breakdown_term(joined, "swarm_round"),
              std::max(0.0, transfer * 15 / 16 - (on_cpu.i + on_cpu.w + cpu_s)) + transfer / 16 + fixed, 1e-12);
  EXPECT_NEAR(test::breakdown_sum(joined), joined.step_s, 1e-12);
  // After the backward the cores do nothing else: the round takes the longer of the two.
  EXPECT_NEAR(test::breakdown_term(plan::predict_swarm(after, 4, cpu), "swarm_round"), transfer + fixed, 1e-12);
  EXPECT_NEAR(test::breakdown_term(plan::predict_swarm(after, 4, priced("cpu", 5)), "swarm_round"),
              5 * cpu_s + fixed, 1e-12);
  EXPECT_EQ(test::breakdown_term(plan::predict_swarm(after, 4, cpu), "swarm_round_cpu"), 0);
  // swarm.overlap_rounds = auto: the faster way, whichever it is.
  Config automatic = c;
  automatic.swarm.overlap_rounds = "auto";
  for (const Cluster& cores : {cpu, priced("cpu", 5)}) {
    const double both[] = {plan::predict_swarm(c, 4, cores).step_s, plan::predict_swarm(after, 4, cores).step_s};
    EXPECT_NEAR(plan::predict_swarm(automatic, 4, cores).step_s, std::min(both[0], both[1]), 1e-15);
  }

  // DiLoCo: a tenth of the int8 round, which takes at least its CPU.
  Config diloco = c;
  diloco.swarm.sync = "diloco";
  diloco.swarm.inner_steps = 10;
  diloco.swarm.pseudo_gradient_dtype = "int8";
  EXPECT_NEAR(test::breakdown_term(plan::predict_swarm(diloco, 4, dear), "swarm_round"),
              (50e-9 * 2 * 0.75 * P + fixed) / 10, 1e-12);
}

// Swarms are searched where the file gives the peers' link (holding swarm.sync plans swarms only),
// a swap where the model does not fit the device otherwise, offload beside the ZeRO stages.
TEST(Search, SwarmsSwapAndOffloadAreSearchedWhereTheClusterPricesThem) {
  Config c = test::planner_config();
  c.train.global_batch_size = 16;
  c.train.grad_accum = 1;
  c.swarm.sync = "diloco";
  const plan::SearchResult swarms =
      plan::search_layouts(c, 4, {"swarm.sync"}, host_cluster(), check_layout_options, 100);
  ASSERT_FALSE(swarms.layouts.empty());
  for (const plan::Candidate& candidate : swarms.layouts) {
    EXPECT_EQ(candidate.peers, 4);
    EXPECT_EQ(candidate.set.front(), (std::pair<std::string, std::string>{"swarm.sync", "diloco"}));
  }
  EXPECT_TRUE(plan::search_layouts(c, 4, {"swarm.sync"}, host_cluster(16, 20, false), check_layout_options, 100)
                  .layouts.empty());

  // A device between the swapped peak and the resident estimate: only swapped layouts fit.
  Config swapped = swap_config();
  swapped.train.global_batch_size = 4;
  swapped.train.grad_accum = 1;
  Config one_device = swapped;
  one_device.memory.swap = false;
  one_device.memory.device_budget_gb = 0;
  const ParallelDims one(one_device.parallel, 1, "test");
  const double resident = plan::predict(one_device, one, host_cluster()).peak_memory_bytes;
  const double peak = plan::predict(swapped, one, host_cluster()).peak_memory_bytes;
  ASSERT_LT(peak, resident);
  const Cluster small = host_cluster((peak + resident) / 2 / (1024.0 * 1024.0 * 1024.0));
  const plan::SearchResult searched =
      plan::search_layouts(one_device, 1, {"train.batch_size"}, small, check_layout_options, 3);
  ASSERT_FALSE(searched.layouts.empty());
  EXPECT_TRUE(searched.layouts.front().prediction.fits);
  EXPECT_TRUE(searched.layouts.front().config.memory.swap);

  Config zero = test::planner_config();
  zero.train.global_batch_size = 16;
  zero.parallel.zero_stage = 2;
  bool offloaded = false;
  for (const plan::Candidate& candidate :
       plan::search_layouts(zero, 2, {"parallel.zero_stage"}, host_cluster(), check_layout_options, 1000).layouts)
    if (candidate.config.parallel.offload) {
      offloaded = true;
      EXPECT_NE(std::find(candidate.set.begin(), candidate.set.end(),
                          std::pair<std::string, std::string>{"parallel.offload", "true"}),
                candidate.set.end());
    }
  EXPECT_TRUE(offloaded);
}

}  // namespace
}  // namespace tessera
