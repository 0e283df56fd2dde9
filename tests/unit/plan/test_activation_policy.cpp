// The activation policy for a device budget (plan/activation_policy.h): the choice is the cheapest
// that fits, offload goes to the earliest blocks and keeping to the latest, a budget too small is
// refused naming the key and what the smallest policy needs; a run under it trains bit-identically
// to the resident run (every option is exact) and holds what the policy predicts.
#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <optional>

#include "memory/saved_activations.h"
#include "plan/activation_estimate.h"
#include "plan/activation_policy.h"
#include "plan/layout.h"
#include "plan/swap_policy.h"
#include "test_util.h"
#include "tiny_config.h"
#include "train/train_step.h"

namespace tessera {
namespace activation_policy_test {
namespace {

// Four blocks of one kind: keeping holds 100 bytes, selective 90, full 10 (the input); F = 1 s.
// Offload costs `offload_s` (its copies beyond what the neighbours hide).
std::vector<std::vector<ActivationOption>> options(double offload_s, size_t blocks = 4) {
  std::vector<ActivationOption> one = {{"none", false, 100, 0, 0},
                                       {"selective", false, 90, 0, 0.3},
                                       {"full", false, 10, 0, 1},
                                       {"none", true, 0, 100, offload_s},
                                       {"full", true, 0, 10, 1 + offload_s}};
  return std::vector<std::vector<ActivationOption>>(blocks, one);
}

std::vector<std::string> names(const ActivationPolicy& p) {
  std::vector<std::string> out;
  for (const ActivationOption& o : p.blocks) out.push_back(o.name());
  return out;
}

TEST(ActivationPolicy, AnAmpleBudgetKeepsEverything) {
  const ActivationPolicy p = choose_activation_policy(options(0), 400);
  EXPECT_EQ(names(p), (std::vector<std::string>{"keep", "keep", "keep", "keep"}));
  EXPECT_EQ(p.seconds, 0);
  EXPECT_EQ(p.bytes, 400);
}

TEST(ActivationPolicy, HiddenCopiesAreOffloadedFromTheFirstBlocks) {
  // 300 bytes: keeping all four needs 400. Offloading two (200 in flight) and keeping two (200)
  // does not fit; offloading one leaves 300 + 200 of reserve. With free copies the cheapest fit
  // offloads three blocks (reserve 200, one kept 100) at no cost.
  const ActivationPolicy p = choose_activation_policy(options(0), 300);
  EXPECT_EQ(names(p), (std::vector<std::string>{"offload", "offload", "offload", "keep"}));
  EXPECT_EQ(p.seconds, 0);
  EXPECT_LE(p.bytes, 300);
}

TEST(ActivationPolicy, ExpensiveCopiesRecomputeInstead) {
  // Offloading costs 5 s a block, recomputing 1 s: two blocks recomputed (10 + 10 + 100 + 100 and
  // one recomputed block's 100 held in its backward = 320) do not fit 300; three do (230).
  const ActivationPolicy p = choose_activation_policy(options(5), 300);
  EXPECT_EQ(names(p), (std::vector<std::string>{"full", "full", "full", "keep"}));
  EXPECT_DOUBLE_EQ(p.seconds, 3);
  EXPECT_DOUBLE_EQ(p.bytes, 230);
}

TEST(ActivationPolicy, ABudgetTooSmallForAnyPolicyIsRefused) {
  // The smallest: every input offloaded (20 in flight) and one block recomputed (100).
  EXPECT_NO_THROW(choose_activation_policy(options(5), 120));
  EXPECT_TRUE(test::throws_naming([&] { choose_activation_policy(options(5), 119); },
                                  {"memory.device_budget_gb", "smallest activation policy", "needs 120.00 B"}));
}

// With int8 allowed: keeping a block encoded holds 30 bytes for 0.2 s of coding. Under 300 bytes,
// recomputing costs 3 s (above); two blocks kept as they are and two encoded (260) cost 0.4 s, and
// the encoded ones are the earliest.
TEST(ActivationPolicy, EncodingIsChosenWhereItIsCheaperThanRecomputing) {
  std::vector<std::vector<ActivationOption>> with_codec = options(5);
  for (auto& block : with_codec) {
    ActivationOption encoded{"none", false, 30, 0, 0.2, "int8"};
    block.push_back(encoded);
  }
  const ActivationPolicy p = choose_activation_policy(with_codec, 300);
  EXPECT_EQ(names(p), (std::vector<std::string>{"keep + int8", "keep + int8", "keep", "keep"}));
  EXPECT_DOUBLE_EQ(p.seconds, 0.4);
  EXPECT_DOUBLE_EQ(p.bytes, 260);
  // Coding dearer than recomputing: recomputation again.
  for (auto& block : with_codec) block.back().seconds = 2;
  EXPECT_EQ(names(choose_activation_policy(with_codec, 300)),
            (std::vector<std::string>{"full", "full", "full", "keep"}));
}

// Without a pipeline: the one share, its budget for activations and its smallest need.
ActivationShare share_of(const Config& c) {
  return activation_shares(c, make_layout(c, ParallelDims(c.parallel, 1, "test"))).at(0);
}
double budget_of(const Config& c) { return share_of(c).budget_bytes; }
double smallest_of(const Config& c) {
  return smallest_activation_bytes(c, ParallelDims(c.parallel, 1, "test"), share_of(c));
}

Config tiny_auto(double budget_gb, double link_gbps) {
  Config c = test::tiny_config(32);
  c.model.n_layer = 4;
  c.train.batch_size = 8;
  c.optim.name = "sgd";
  c.memory.activation_policy = "auto";
  c.memory.device_budget_gb = budget_gb;
  c.memory.modelled_bandwidth_gbps = link_gbps;
  return c;
}

std::vector<Batch> batches(const Config& c) {
  at::Generator g = at::make_generator<at::CPUGeneratorImpl>(7);
  const at::Tensor tokens = at::randint(c.model.vocab_size, {c.train.batch_size, c.train.seq_len + 1}, g, at::kLong);
  return {{tokens.narrow(1, 0, c.train.seq_len).contiguous(), tokens.narrow(1, 1, c.train.seq_len).contiguous()}};
}

struct PolicyRun {
  std::map<std::string, at::Tensor> grads;
  int64_t peak = 0;
  std::optional<ActivationPolicy> policy;  // the layout's, copied (the step goes)
};

PolicyRun run(const Config& c) {
  TrainStep step(c, nullptr);
  PolicyRun r;
  if (const ActivationPolicy* p = step.layout().activation_policy()) r.policy = *p;
  count_saved_activations(true);
  reset_saved_activation_peak();
  step.run(batches(c), c.optim.lr, [&](const NamedTensors& g) {
    for (const auto& [name, t] : g) r.grads[name] = t.clone();
  });
  r.peak = saved_activation_bytes().peak;
  count_saved_activations(false);
  return r;
}

// Over a slow link (offload costs more than recomputing) the policy recomputes, deterministically:
// the run holds no more than the policy's bytes, and every gradient equals the resident run's; just
// above the smallest need it must offload, and trains exactly as well.
TEST(ActivationPolicy, ARunUnderTheBudgetHoldsWhatThePolicySaysAndTrainsExactly) {
  Config resident = tiny_auto(0, 16);
  resident.memory.activation_policy = "manual";
  resident.memory.device_budget_gb = 0;
  const PolicyRun keep = run(resident);
  // A budget leaving about 60% of what keeping every block needs, beside the model's state.
  Config slow = tiny_auto(1, 0.001);
  const double gib = 1024.0 * 1024.0 * 1024.0;
  const double state = gib - budget_of(slow);
  slow.memory.device_budget_gb = (state + static_cast<double>(keep.peak) * 0.6) / gib;
  const PolicyRun chosen = run(slow);
  ASSERT_TRUE(chosen.policy.has_value());
  EXPECT_EQ(chosen.policy->offloaded(), 0) << describe_activation_policy(*chosen.policy);
  EXPECT_LE(chosen.policy->bytes, chosen.policy->budget_bytes);
  // What autograd held for the blocks (the recomputed block's activations, which the policy's total
  // also reserves, are made during the backward outside any scope's count).
  EXPECT_LE(static_cast<double>(chosen.peak), chosen.policy->budget_bytes) << describe_activation_policy(*chosen.policy);
  EXPECT_LT(chosen.peak, keep.peak);
  for (const auto& [name, g] : keep.grads) EXPECT_TRUE(chosen.grads.at(name).equal(g)) << name;
  std::printf("measured: resident %lld bytes; under a %.0f-byte share the policy holds %lld\n%s",
              static_cast<long long>(keep.peak), chosen.policy->budget_bytes, static_cast<long long>(chosen.peak),
              describe_activation_policy(*chosen.policy).c_str());
  // A share just above the smallest policy's need leaves no choice but recomputing every block with
  // its input offloaded (keeping one more input would not fit): the offloading run trains exactly too.
  Config tight = tiny_auto(1, 16);
  const double input = 4.0 * static_cast<double>(tight.train.batch_size * tight.train.seq_len * tight.model.n_embd);
  tight.memory.device_budget_gb =
      (state + smallest_of(tight) + input / 2) / gib;
  const PolicyRun offloaded = run(tight);
  ASSERT_TRUE(offloaded.policy.has_value());
  EXPECT_EQ(offloaded.policy->offloaded(), tight.model.n_layer) << describe_activation_policy(*offloaded.policy);
  for (const auto& [name, g] : keep.grads) EXPECT_TRUE(offloaded.grads.at(name).equal(g)) << name;
}

// With int8 allowed and a share just above the smallest policy's need (every block offloaded
// encoded: two encoded blocks in flight hold less than two plain inputs and a recomputed block),
// the policy has one choice; the run applies it block by block: its gradients equal those of the
// same choice made by hand (manual keys), differ from the resident run's (the encoding is lossy),
// and it holds less than that share.
TEST(ActivationPolicy, AnEncodedChoiceTrainsAsTheSameChoiceMadeByHand) {
  Config resident = tiny_auto(0, 16);
  // One head of 32: a head width of 8 would be encoded in groups of 8, more than the estimate's
  // groups of 32 (activation_codec.h), and its attention output twice (as [B, H, T, d] and [B T, C]).
  resident.model.n_head = 1;
  resident.memory.activation_policy = "manual";
  resident.memory.device_budget_gb = 0;
  const PolicyRun keep = run(resident);
  Config by_hand = resident;
  by_hand.memory.activation_compression = "int8";
  by_hand.memory.activation_offload = by_hand.model.n_layer;
  const PolicyRun manual = run(by_hand);
  Config tight = tiny_auto(1, 16);
  tight.model.n_head = 1;
  tight.memory.activation_compression = "int8";
  const double gib = 1024.0 * 1024.0 * 1024.0;
  const double state = gib - budget_of(tight);
  // An encoded input: a byte and a 32nd of a float32 scale per element.
  const double input = 1.125 * static_cast<double>(tight.train.batch_size * tight.train.seq_len * tight.model.n_embd);
  const double smallest = smallest_of(tight);
  Config plain = tight;
  plain.memory.activation_compression = "none";
  EXPECT_LT(smallest, smallest_of(plain));  // the codec makes the smallest smaller
  tight.memory.device_budget_gb = (state + smallest + input / 2) / gib;
  const PolicyRun chosen = run(tight);
  ASSERT_TRUE(chosen.policy.has_value());
  for (const ActivationOption& o : chosen.policy->blocks)
    EXPECT_EQ(o.name(), "offload + int8") << describe_activation_policy(*chosen.policy);
  // What autograd held: two groups in flight and every block's statistics, as the policy counts.
  EXPECT_LE(static_cast<double>(chosen.peak), chosen.policy->budget_bytes);
  EXPECT_NEAR(static_cast<double>(chosen.peak), chosen.policy->bytes, 0.02 * chosen.policy->bytes)
      << describe_activation_policy(*chosen.policy);
  bool differs = false;
  for (const auto& [name, g] : manual.grads) {
    EXPECT_TRUE(chosen.grads.at(name).equal(g)) << name;
    differs = differs || !keep.grads.at(name).equal(g);
  }
  EXPECT_TRUE(differs);
}

// On CUDA offload's copies are priced over the host link the profile measured; on a CPU "device"
// over memory.modelled_bandwidth_gbps. A block with no compute to hide them pays both ways.
TEST(ActivationPolicy, OffloadIsPricedOverTheMeasuredHostLinkWhereThereIsOne) {
  const Config c = tiny_auto(1, 16);
  const ParallelDims dims(c.parallel, 1, "test");
  BlockCosts measured;
  measured.block_split.assign(static_cast<size_t>(c.model.n_layer), {0, 0, 0, 0});
  auto offload_seconds = [&] {
    const auto options = activation_options(c, dims, measured, false);
    for (const ActivationOption& o : options[0])
      if (o.offload && o.checkpointing == "none") return std::make_pair(o.seconds, o.group);
    return std::make_pair(-1.0, 0.0);
  };
  const auto [modelled, group] = offload_seconds();
  EXPECT_DOUBLE_EQ(modelled, 2 * group / 16e9);
  measured.link_bytes_per_s = 50e9;
  EXPECT_DOUBLE_EQ(offload_seconds().first, 2 * group / 50e9);
}

// Under a pipeline each rank chooses for its own blocks, their bytes times the micro-batches its
// schedule holds at once: 1F1B over two ranks and four micro-batches holds two on rank 0 and one
// on rank 1. A budget leaving rank 0 three blocks' worth (its two blocks kept need four) and rank 1
// at least two: rank 0 must save, rank 1 keeps both.
TEST(ActivationPolicy, EachPipelineRankChoosesForItsBlocksAndTheMicroBatchesItHolds) {
  Config c = tiny_auto(1, 16);
  c.parallel.pp = 2;
  c.train.grad_accum = 4;
  const ParallelDims dims(c.parallel, 2, "test");
  BlockCosts measured;
  for (int64_t l = 0; l < c.model.n_layer; ++l) measured.block_split.push_back({1e-3, 2e-3, 1e-3, 1e-3});
  const double gib = 1024.0 * 1024.0 * 1024.0;
  const double keep = activation_options(c, dims, measured, false)[0][0].bytes;
  const std::vector<ActivationShare> at_1gib = activation_shares(c, make_layout(c, dims));
  ASSERT_EQ(at_1gib.size(), 2u);
  const double state0 = gib - at_1gib[0].budget_bytes, state1 = gib - at_1gib[1].budget_bytes;
  c.memory.device_budget_gb = (state0 + 3 * keep) / gib;
  ASSERT_GE(c.memory.device_budget_gb * gib - state1, 2 * keep);
  const Layout layout = make_layout(c, dims);
  const std::vector<ActivationPolicy> policies = choose_activation_policies(c, layout, measured, false);
  ASSERT_EQ(policies.size(), 2u);
  EXPECT_EQ(policies[0].layers, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(policies[1].layers, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(policies[0].held, 2);
  EXPECT_EQ(policies[1].held, 1);
  for (const ActivationPolicy& p : policies) {
    EXPECT_EQ(p.pipeline_rank, &p - policies.data());
    EXPECT_EQ(p.groups_in_flight, 3);
    EXPECT_LE(p.bytes, p.budget_bytes) << describe_activation_policy(p);
  }
  EXPECT_GT(policies[0].seconds, 0) << describe_activation_policy(policies[0]);
  EXPECT_EQ(names(policies[1]), (std::vector<std::string>{"keep", "keep"})) << describe_activation_policy(policies[1]);
  std::printf("%s%s", describe_activation_policy(policies[0]).c_str(), describe_activation_policy(policies[1]).c_str());
}

// A rank holding several micro-batches may keep one on the device and offload every block of the
// others (ActivationPolicy::resident_micro_batches): 1F1B over four ranks and eight micro-batches,
// rank 0 of two blocks holds four; a share of five and a half blocks' worth cannot keep them all
// (eight) and offloading a block on every micro-batch reserves three of its groups, but one
// micro-batch kept and the others offloaded fits (two blocks, three groups, the statistics of
// three micro-batches), paying the copies for the 6 of its 8 forwards offloaded, hidden behind
// the rank's stage (its two blocks' F and B) but for the cores' memcpys: the cheapest.
TEST(ActivationPolicy, APipelineRankOffloadsItsHeldMicroBatchesWhereThatIsCheapest) {
  Config c = tiny_auto(1, 16);
  c.model.n_layer = 8;
  c.parallel.pp = 4;
  c.train.grad_accum = 8;
  const ParallelDims dims(c.parallel, 4, "test");
  BlockCosts measured;
  for (int64_t l = 0; l < c.model.n_layer; ++l) measured.block_split.push_back({1e-3, 2e-3, 1e-3, 1e-3});
  measured.copy_bytes_per_s = 1e10;  // a CPU "device": each memcpy takes the cores' time
  const double gib = 1024.0 * 1024.0 * 1024.0;
  const ActivationOption keep = activation_options(c, dims, measured, true)[0][0];
  const double state0 = gib - activation_shares(c, make_layout(c, dims))[0].budget_bytes;
  c.memory.device_budget_gb = (state0 + 5.5 * keep.bytes) / gib;
  const Layout layout = make_layout(c, dims);
  const ActivationPolicy p = choose_activation_policies(c, layout, measured, true)[0];
  ASSERT_EQ(p.held, 4);
  EXPECT_EQ(p.resident_micro_batches, 1) << describe_activation_policy(p);
  EXPECT_DOUBLE_EQ(p.held_offloaded, 6.0 / 8.0);
  EXPECT_EQ(names(p), (std::vector<std::string>{"keep", "keep"})) << describe_activation_policy(p);
  const double copies = offload_copy_seconds(keep.held_group, 2e-3, 4e-3, 16e9, 1 / measured.copy_bytes_per_s);
  EXPECT_GT(copies, 0);
  EXPECT_NEAR(p.seconds, 2 * 0.75 * copies, 1e-12);
  EXPECT_DOUBLE_EQ(p.held_reserve, 3 * (keep.bytes - keep.held_stays));
  EXPECT_LE(p.bytes, p.budget_bytes) << describe_activation_policy(p);
  EXPECT_NE(describe_activation_policy(p).find("held micro-batches: 1 (of a stage) kept on the device"),
            std::string::npos) << describe_activation_policy(p);
  // Without the held micro-batches' option the same share needs both blocks offloaded on every
  // micro-batch, or recomputed: dearer.
  std::vector<HeldMoment> moments{{4, 0, 0}};
  const ActivationPolicy every = choose_activation_policy(
      std::vector<std::vector<ActivationOption>>(2, activation_options(c, dims, measured, true)[0]), p.budget_bytes,
      moments, 3);
  EXPECT_GT(every.seconds, p.seconds) << describe_activation_policy(every);
  std::printf("%s%s", describe_activation_policy(p).c_str(), describe_activation_policy(every).c_str());
}

// Under a schedule that splits the backward a micro-batch that ran its I holds, until its W, its
// option's awaiting bytes: I's kept output gradients and what W needs (an offloaded block's group
// fetched back whole), nothing for a fully recomputed block (it finishes inside I). zbh1 over two
// ranks holds two micro-batches on rank 0, one of them awaiting its W at the worst moment; each
// share lists such moments, and a choice fits each.
TEST(ActivationPolicy, UnderASplitBackwardMicroBatchesAwaitingWCountWhatTheyKeep) {
  // Synthetic: keeping holds 100 before I and 150 awaiting W; full recomputation 10 and 0.
  std::vector<std::vector<ActivationOption>> one = {{{"none", false, 100, 0, 0, "none", 150},
                                                     {"full", false, 10, 0, 1, "none", 0}}};
  const std::vector<HeldMoment> moments = {{2, 0}, {1, 1}};
  // Keeping: the worst moment is one before I and one awaiting W (250 > 200); recomputing holds
  // 20 then plus its whole block (100) in its backward.
  EXPECT_EQ(names(choose_activation_policy(one, 250, moments)), (std::vector<std::string>{"keep"}));
  EXPECT_EQ(names(choose_activation_policy(one, 249, moments)), (std::vector<std::string>{"full"}));
  EXPECT_DOUBLE_EQ(choose_activation_policy(one, 249, moments).bytes, 120);

  Config c = tiny_auto(1, 16);
  c.parallel.pp = 2;
  c.parallel.pp_schedule = "zbh1";
  c.train.grad_accum = 4;
  EXPECT_NO_THROW(c.check("code"));
  const ParallelDims dims(c.parallel, 2, "test");
  const std::vector<ActivationShare> shares = activation_shares(c, make_layout(c, dims));
  ASSERT_EQ(shares.size(), 2u);
  bool awaits = false;
  for (const HeldMoment& m : shares[0].moments) awaits = awaits || m.awaiting_w > 0;
  EXPECT_TRUE(awaits);
  const auto options = activation_options(c, dims, BlockCosts(), false);
  for (const ActivationOption& o : options[0]) {
    if (o.checkpointing == "full") {
      EXPECT_EQ(o.awaiting, 0) << o.name();
    }
    if (o.offload && o.checkpointing == "none") {
      EXPECT_GT(o.awaiting, options[0][0].bytes) << o.name();
    }
  }
  // The estimate's own count for a kept block awaiting W: its bytes plus I's extra.
  const double tokens = static_cast<double>(c.train.batch_size * c.train.seq_len);
  EXPECT_NEAR(options[0][0].awaiting, options[0][0].bytes + awaiting_w_bytes_per_token(c, dims, 0).extra() * tokens,
              1e-6 * options[0][0].bytes);
}

// With two codecs allowed ("bf16,int8") each block has every option in each: bf16 halves a float32
// block's bytes at the lesser coding time, int8 keeps about a quarter at the greater. A budget that
// does not hold every block in bf16 but holds two in int8 and two in bf16 gets exactly that, int8
// in the earliest; one that holds them all in bf16 encodes none in int8.
TEST(ActivationPolicy, EachBlockChoosesAmongTheAllowedCodecs) {
  Config c = tiny_auto(1, 0.001);  // copies too slow to offload
  c.model.n_head = 1;  // one encoding of the attention output (AnEncodedChoiceTrainsAsTheSameChoiceMadeByHand)
  c.memory.activation_compression = "bf16,int8";
  const ParallelDims dims(c.parallel, 1, "test");
  BlockCosts measured;
  measured.block_split.assign(static_cast<size_t>(c.model.n_layer), {1e-3, 2e-3, 1e-3, 1e-3});  // recomputing: 1 ms
  measured.codec_seconds_per_byte = {{"bf16", 1e-10}, {"int8", 2e-10}};
  const auto options = activation_options(c, dims, measured, false);
  auto kept = [&](const std::string& codec) {
    for (const ActivationOption& o : options[0])
      if (o.compression == codec && !o.offload && o.checkpointing == "none") return o;
    ADD_FAILURE() << "no keep + " << codec;
    return ActivationOption{};
  };
  const ActivationOption plain = kept("none"), bf16 = kept("bf16"), int8 = kept("int8");
  EXPECT_NEAR(bf16.bytes, plain.bytes / 2, 0.02 * plain.bytes);  // the float32 statistics stay
  EXPECT_LT(int8.bytes, 0.6 * bf16.bytes);
  EXPECT_DOUBLE_EQ(bf16.seconds, plain.bytes * 1e-10);
  EXPECT_DOUBLE_EQ(int8.seconds, plain.bytes * 2e-10);
  // (1% over: the choice rounds each block's bytes up to 1/4096 of the budget)
  const ActivationPolicy mixed = choose_activation_policy(options, 1.01 * (2 * int8.bytes + 2 * bf16.bytes));
  EXPECT_EQ(names(mixed), (std::vector<std::string>{"keep + int8", "keep + int8", "keep + bf16", "keep + bf16"}))
      << describe_activation_policy(mixed);
  EXPECT_DOUBLE_EQ(mixed.seconds, 2 * int8.seconds + 2 * bf16.seconds);
  const ActivationPolicy halves = choose_activation_policy(options, 1.01 * 4 * bf16.bytes);
  EXPECT_EQ(names(halves), (std::vector<std::string>{"keep + bf16", "keep + bf16", "keep + bf16", "keep + bf16"}));
  // A run at that budget (the profile's own rates decide, so its choice may differ; the copies too
  // slow to offload): autograd holds what the policy counts, each block in its own codec.
  const double gib = 1024.0 * 1024.0 * 1024.0;
  c.memory.device_budget_gb = (gib - budget_of(c) + mixed.bytes) / gib;
  const PolicyRun run_mixed = run(c);
  ASSERT_TRUE(run_mixed.policy.has_value());
  const ActivationPolicy& chosen = *run_mixed.policy;
  EXPECT_EQ(chosen.offloaded(), 0) << describe_activation_policy(chosen);
  EXPECT_LE(static_cast<double>(run_mixed.peak), chosen.budget_bytes);
  // A fully recomputed block (a loaded machine's profile may choose one) makes its activations
  // outside the count, which the policy reserves.
  double counted = chosen.bytes;
  for (const ActivationOption& o : chosen.blocks)
    if (o.checkpointing == "full") {
      counted -= options[0][0].bytes;
      break;
    }
  EXPECT_NEAR(static_cast<double>(run_mixed.peak), counted, 0.02 * counted) << describe_activation_policy(chosen);
}

// memory.attention_compression: every option that keeps the block's activations holds its
// attention core at the core's codec, whatever the option's, and pays that codec's rate for it; a
// run under the policy holds what it counts.
TEST(ActivationPolicy, TheAttentionCoresOwnCodecIsCountedAndPricedInEveryOption) {
  Config c = tiny_auto(1, 0.001);  // copies too slow to offload
  c.model.n_head = 1;
  c.memory.activation_compression = "int4";
  const ParallelDims dims(c.parallel, 1, "test");
  BlockCosts measured;
  measured.block_split.assign(static_cast<size_t>(c.model.n_layer), {1e-3, 2e-3, 1e-3, 1e-3});
  measured.codec_seconds_per_byte = {{"int4", 2e-10}, {"int8", 1e-10}};
  auto kept = [&](const Config& config, const std::string& codec) {
    const std::vector<std::vector<ActivationOption>> options = activation_options(config, dims, measured, false);
    for (const ActivationOption& o : options[0])
      if (o.compression == codec && !o.offload && o.checkpointing == "none") return o;
    ADD_FAILURE() << "no keep + " << codec;
    return ActivationOption{};
  };
  Config core = c;
  core.memory.attention_compression = "int8";
  // Unencoded, the core alone is encoded (held in less, paid for); int4, the core holds more at
  // int8's faster rate here.
  EXPECT_LT(kept(core, "none").bytes, 0.9 * kept(c, "none").bytes);
  EXPECT_EQ(kept(c, "none").seconds, 0);
  EXPECT_GT(kept(core, "none").seconds, 0);
  EXPECT_GT(kept(core, "int4").bytes, 1.05 * kept(c, "int4").bytes);
  EXPECT_LT(kept(core, "int4").seconds, kept(c, "int4").seconds);
  EXPECT_GT(kept(core, "int4").seconds, kept(core, "none").seconds);
  // A run whose budget holds every block kept at int4 (the core at int8): autograd holds what the
  // policy counts.
  const ActivationOption int4 = kept(core, "int4");
  const double gib = 1024.0 * 1024.0 * 1024.0;
  core.memory.device_budget_gb = (gib - budget_of(core) + 1.01 * 4 * int4.bytes) / gib;
  const PolicyRun r = run(core);
  ASSERT_TRUE(r.policy.has_value());
  EXPECT_EQ(r.policy->offloaded(), 0) << describe_activation_policy(*r.policy);
  EXPECT_LE(static_cast<double>(r.peak), r.policy->budget_bytes);
  double counted = r.policy->bytes;
  for (const ActivationOption& o : r.policy->blocks)
    if (o.checkpointing == "full") {
      counted -= kept(core, "none").bytes;
      break;
    }
  EXPECT_NEAR(static_cast<double>(r.peak), counted, 0.02 * counted) << describe_activation_policy(*r.policy);
}

// Before anything is measured (inspect, --dry-run, the launcher): a budget whose share for
// activations is below the smallest policy's need is refused with both figures.
TEST(ActivationPolicy, ABudgetTooSmallIsRefusedBeforeTheRun) {
  Config c = tiny_auto(1, 16);
  const ParallelDims dims(c.parallel, 1, "test");
  const double gib = 1024.0 * 1024.0 * 1024.0;
  const double state = gib - budget_of(c), smallest = smallest_of(c);
  c.memory.device_budget_gb = (state + smallest) / gib;
  EXPECT_NO_THROW(check_activation_budget(c, dims));
  c.memory.device_budget_gb = (state + smallest * 0.9) / gib;
  EXPECT_TRUE(test::throws_naming([&] { check_activation_budget(c, dims); },
                                  {"memory.device_budget_gb", "smallest activation policy", "needs"}));
  c.memory.device_budget_gb = state * 0.5 / gib;
  EXPECT_TRUE(test::throws_naming([&] { check_activation_budget(c, dims); }, {"does not hold the model's state"}));
}

// Under swap the policy is chosen with the swap plan (plan/swap_policy.h), every sub-model loaded
// each step: four blocks whose parameters each weigh one block's kept activations. An ample budget
// keeps every block's activations; a budget of 4.75 blocks' parameters, which holds two
// neighbouring sub-models' parameters and gradients (the partitioner's window) but not beside all
// four blocks' kept activations, has them recomputed or offloaded, and its plan fits. A budget
// below two neighbours' needs is refused naming the key.
TEST(ActivationPolicy, UnderSwapThePolicyIsChosenWithTheSwapPlan) {
  Config c = tiny_auto(1, 16);
  c.memory.swap = true;
  const ParallelDims dims(c.parallel, 1, "test");
  const double keep = activation_options(c, dims, BlockCosts(), false)[0][0].bytes;
  const double gib = 1024.0 * 1024.0 * 1024.0;
  auto costs = [&](double forward_s, double bandwidth) {
    SwapCosts s;
    for (int64_t l = 0; l < c.model.n_layer; ++l) {
      swap::SubModel b;
      b.first = l, b.end = l + 1;
      b.parameter_bytes = b.gradient_bytes = keep;
      b.forward_s = forward_s, b.backward_s = 2 * forward_s;
      s.blocks.push_back(b);
    }
    s.ends.parameter_bytes = s.ends.gradient_bytes = keep / 16;
    s.bandwidth = bandwidth;
    return s;
  };
  auto measured = [&](double forward_s) {
    BlockCosts m;
    for (int64_t l = 0; l < c.model.n_layer; ++l) m.block_split.push_back({forward_s, 2 * forward_s, forward_s, forward_s});
    return m;
  };
  const auto fits = [](const SwappedActivationPolicy& p) {
    return swap::occupancy(p.plan).peak <= p.plan.device_budget_bytes;
  };
  c.memory.device_budget_gb = 64 * keep / gib;
  const SwappedActivationPolicy ample = choose_swapped_activation_policy(c, dims, measured(1e-3), costs(1e-3, 1e9), true);
  EXPECT_EQ(names(ample.policy), std::vector<std::string>(4, "keep"));
  EXPECT_TRUE(fits(ample));

  c.memory.device_budget_gb = (4.75 * keep) / gib;
  const SwappedActivationPolicy tight = choose_swapped_activation_policy(c, dims, measured(1e-3), costs(1e-3, 1e9), true);
  const std::vector<std::string> chosen = names(tight.policy);
  EXPECT_NE(chosen, std::vector<std::string>(4, "keep"));
  EXPECT_TRUE(fits(tight));
  EXPECT_GT(tight.candidates, 1);
  EXPECT_EQ(tight.policy.layers, (std::vector<int64_t>{0, 1, 2, 3}));

  c.memory.device_budget_gb = keep / gib;
  EXPECT_TRUE(test::throws_naming([&] { choose_swapped_activation_policy(c, dims, measured(1e-3), costs(1e-3, 1e9), true); },
                                  {"memory.device_budget_gb", "memory.swap = true", "no activation policy"}));
}

TEST(ActivationPolicy, KeysAreCheckedByName) {
  Config c = tiny_auto(0, 16);
  EXPECT_TRUE(test::throws_naming([&] { c.check("code"); }, {"memory.activation_policy = auto needs memory.device_budget_gb"}));
  c = tiny_auto(1, 16);
  c.memory.activation_checkpointing = "full";
  EXPECT_TRUE(test::throws_naming([&] { c.check("code"); }, {"chooses each block's checkpointing"}));
  // A list of codecs is an allowance for the policy: each named once, not none, not under manual.
  c = tiny_auto(1, 16);
  for (const char* good : {"bf16,int8", "int8,int4"}) {
    c.memory.activation_compression = good;
    EXPECT_NO_THROW(c.check("code")) << good;
  }
  c.memory.attention_compression = "int8";
  EXPECT_NO_THROW(c.check("code"));
  c.memory.attention_compression = "int8,int4";
  EXPECT_TRUE(test::throws_naming([&] { c.check("code"); }, {"memory.attention_compression must be same", "int8,int4"}));
  c.memory.attention_compression = "same";
  for (const char* bad : {"none,int8", "int8,int8", "int8,int2"}) {
    c.memory.activation_compression = bad;
    EXPECT_TRUE(test::throws_naming([&] { c.check("code"); }, {"memory.activation_compression"})) << bad;
  }
  c.memory.activation_compression = "bf16,int8";
  c.memory.activation_policy = "manual";
  c.memory.device_budget_gb = 0;
  EXPECT_TRUE(test::throws_naming([&] { c.check("code"); }, {"memory.activation_compression = 'bf16,int8'",
                                                            "activation_policy = manual name one"}));
  c = tiny_auto(1, 16);
  c.memory.activation_policy = "fast";
  EXPECT_TRUE(test::throws_naming([&] { c.check("code"); }, {"memory.activation_policy must be manual or auto"}));
}

}  // namespace
}  // namespace activation_policy_test
}  // namespace tessera
