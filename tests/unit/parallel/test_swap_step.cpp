// A swapped run's state is the resident run's: a swapped run's model and optimizer state, loaded
// into a resident run, continue bit-identically to the swapped run continuing, and the reverse
// (the same tensors a checkpoint holds: model_state() and training_state()). Evaluation of a
// swapped model equals the resident one's. Gradients written and applied alone (the swarm's replay)
// update as a step does. The host memory a swapped run needs is predicted and a host too small for
// it is refused naming memory.swap.
#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include "parallel/layout_check.h"
#include "parallel/parallelize.h"
#include "plan/activation_estimate.h"
#include "plan/swap_cut.h"
#include "test_util.h"
#include "tiny_config.h"
#include "train/train_step.h"

namespace tessera {
namespace {

Config tiny(bool swapped) {
  Config c = test::tiny_config(8);
  c.model.n_layer = 3;
  c.model.bias = false;
  c.train.grad_accum = 2;
  c.train.threads = 1;
  c.optim.grad_clip = 1.0;
  if (swapped) {
    c.memory.swap = true;
    c.memory.device_budget_gb = 1;
    c.memory.modelled_bandwidth_gbps = 64;
    c.memory.swap_blocks = {1, 2};
  }
  return c;
}

std::vector<Batch> micro_batches(int64_t step, const Config& c) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(100 + step);
  std::vector<Batch> out;
  for (int m = 0; m < 2; ++m) {
    const at::Tensor tokens = at::randint(c.model.vocab_size, {2, c.train.seq_len + 1}, gen, at::kLong);
    out.push_back({tokens.narrow(1, 0, c.train.seq_len).contiguous(), tokens.narrow(1, 1, c.train.seq_len).contiguous()});
  }
  return out;
}

std::map<std::string, at::Tensor> as_map(const NamedTensors& named) {
  std::map<std::string, at::Tensor> out;
  for (const auto& [name, t] : named) out[name] = t.clone();
  return out;
}

// `to` takes `from`'s model and optimizer state, as a resume from its checkpoint does.
void resume(TrainStep& to, TrainStep& from) {
  const auto model = as_map(from.model_state());
  to.load_model_state(model_reader(model, "test checkpoint"));
  to.load_training_state(as_map(from.training_state()), "test checkpoint");
}

double max_difference(TrainStep& a, TrainStep& b) {
  const auto x = as_map(a.model_state()), y = as_map(b.model_state());
  double worst = 0;
  for (const auto& [name, t] : x) worst = std::max(worst, (t - y.at(name)).abs().max().item<double>());
  return worst;
}

TEST(SwapStep, StateResumesAcrossSwappedAndResidentBitIdentically) {
  for (const bool from_swapped : {true, false}) {
    const Config a = tiny(from_swapped), b = tiny(!from_swapped);
    TrainStep original(a);
    for (int64_t s = 0; s < 2; ++s) original.run(micro_batches(s, a), 1e-3);
    TrainStep resumed(b);
    resume(resumed, original);
    EXPECT_EQ(max_difference(original, resumed), 0.0);
    const StepResult x = original.run(micro_batches(2, a), 1e-3), y = resumed.run(micro_batches(2, b), 1e-3);
    EXPECT_EQ(x.ce_loss, y.ce_loss) << (from_swapped ? "swapped -> resident" : "resident -> swapped");
    EXPECT_EQ(x.grad_norm, y.grad_norm);
    EXPECT_EQ(max_difference(original, resumed), 0.0) << (from_swapped ? "swapped -> resident" : "resident -> swapped");
    EXPECT_EQ(original.evaluate(micro_batches(3, a)), resumed.evaluate(micro_batches(3, b)));
  }
}

// The ATOM swarm's replay (atom/round_log.h): gradients written into a step's holder and applied
// alone update the model and its optimizer state exactly as a step does whose outer reduction
// writes the same gradients (a round's mean) before its update, resident and swapped, over two
// rounds (AdamW's step count and moments carry into the second).
TEST(SwapStep, AnUpdateFromWrittenGradientsIsTheStepsOwn) {
  for (const bool swapped : {false, true}) {
    const Config c = tiny(swapped);
    TrainStep stepped(c), replayed(c);
    std::vector<at::Tensor> means;
    auto write = [](const at::Tensor& mean, const std::vector<at::Tensor>& gradients) {
      int64_t at = 0;
      for (const at::Tensor& g : gradients) {
        g.copy_(mean.narrow(0, at, g.numel()).view(g.sizes()));
        at += g.numel();
      }
    };
    stepped.set_outer_reduction([&](const std::vector<at::Tensor>& gradients, int64_t) {
      std::vector<at::Tensor> flat;
      for (const at::Tensor& g : gradients) flat.push_back(g.reshape(-1));
      means.push_back(at::cat(flat) * 0.5 + 0.001);  // not the step's own: a round's mean
      write(means.back(), gradients);
      return true;
    });
    for (int64_t s = 0; s < 2; ++s) {
      const double lr = 1e-3 * static_cast<double>(s + 1);
      const StepResult r = stepped.run(micro_batches(s, c), lr);
      GradientHolder* holder = replayed.gradient_holder();
      ASSERT_NE(holder, nullptr);
      write(means.back(), holder->final_gradients());
      const UpdateResult u = holder->apply_written_gradients(lr, c.optim.grad_clip);
      EXPECT_EQ(u.grad_norm.item<double>(), r.grad_norm) << (swapped ? "swapped" : "resident") << " round " << s;
      EXPECT_EQ(max_difference(stepped, replayed), 0.0) << (swapped ? "swapped" : "resident") << " round " << s;
      const auto a = as_map(stepped.training_state()), b = as_map(replayed.training_state());
      ASSERT_EQ(a.size(), b.size());
      for (const auto& [name, t] : a) EXPECT_TRUE(at::equal(t, b.at(name))) << name << " round " << s;
    }
  }
}

TEST(SwapStep, HostMemoryIsPredictedAndAHostTooSmallIsRefused) {
  Config c = tiny(true);
  c.memory.swap_blocks.clear();
  const swap::SwapPlan plan = plan_swap(c, measure_swap_costs(c, c10::Device(at::kCPU)));
  const SwapHostMemory host = swap_host_memory(c, plan);
  int64_t params = 0;
  for (const auto& p : TransformerLM(c.model)->parameters()) params += p.numel();
  EXPECT_EQ(host.masters, 4.0 * params);
  EXPECT_EQ(host.gradients, 4.0 * params);
  EXPECT_EQ(host.optimizer, 8.0 * params);  // exp_avg, exp_avg_sq
  EXPECT_EQ(host.device, plan.device_budget_bytes);      // the CPU "device" is host memory
  check_swap_host_memory(c, plan, host.total());
  EXPECT_TRUE(test::throws_naming([&] { check_swap_host_memory(c, plan, host.total() - 1); },
                                  {"memory.swap", "host memory", "optimizer state (adamw)"}));
}

// memory.activation_offload under swap: the offloaded blocks hold no activations from forward to
// backward in the plan, and two of them in flight come out of the budget.
TEST(SwapStep, ThePlanCountsOffloadedActivationsOffTheDevice) {
  Config c = tiny(true);
  c.memory.swap_blocks.clear();
  const SwapCosts resident = measure_swap_costs(c, c10::Device(at::kCPU));
  c.memory.activation_offload = 2;
  const SwapCosts offloaded = measure_swap_costs(c, c10::Device(at::kCPU));
  ASSERT_EQ(offloaded.blocks.size(), 3u);
  EXPECT_EQ(offloaded.blocks[0].activation_bytes, 0);
  EXPECT_EQ(offloaded.blocks[1].activation_bytes, 0);
  EXPECT_GT(offloaded.blocks[2].activation_bytes, 0);
  EXPECT_EQ(offloaded.reserved_bytes,
            2 * std::max(resident.blocks[0].activation_bytes, resident.blocks[1].activation_bytes));
  EXPECT_EQ(plan_swap(c, offloaded).device_budget_bytes,
            plan_swap(c, resident).device_budget_bytes - offloaded.reserved_bytes);
}

// Full checkpointing chosen by hand: each block keeps its input from forward to backward, and the
// backward's recomputation holds one block's whole activations at a time, which the budget keeps
// out of the plan (plan/swap_cut.h, recompute_reserve).
TEST(SwapStep, AHandMadeFullCheckpointingReservesTheBlockItRecomputes) {
  Config c = tiny(true);
  c.memory.swap_blocks.clear();
  const SwapCosts kept = measure_swap_costs(c, c10::Device(at::kCPU));
  EXPECT_EQ(kept.reserved_bytes, 0);
  c.memory.activation_checkpointing = "full";
  const SwapCosts recomputed = measure_swap_costs(c, c10::Device(at::kCPU));
  const ParallelDims one(c.parallel, 1, "test");
  double whole = 0;
  for (int64_t l = 0; l < c.model.n_layer; ++l) whole = std::max(whole, recomputed_block_bytes(c, one, l));
  EXPECT_EQ(recomputed.reserved_bytes, whole);
  for (const swap::SubModel& b : recomputed.blocks) EXPECT_GT(whole, b.activation_bytes);
  EXPECT_EQ(plan_swap(c, recomputed).device_budget_bytes, plan_swap(c, kept).device_budget_bytes - whole);
  // A budget the reserve leaves too little of is refused with the budget as given and the reserve.
  c.memory.device_budget_gb = 1.01 * whole / (1024.0 * 1024.0 * 1024.0);
  EXPECT_TRUE(test::throws_naming([&] { plan_swap(c, recomputed); },
                                  {"memory.device_budget_gb = ", "reserved (", "left)", "too small for block"}));
}

TEST(SwapStep, LayoutsItCannotTrainAreRefusedByKey) {
  Config c = tiny(true);
  c.parallel.tp = 2;
  EXPECT_TRUE(test::throws_naming([&] { check_layout_options(c, ParallelDims(c.parallel, 2, "test")); },
                                  {"memory.swap = true", "tp=2", "not implemented yet"}));
  c = tiny(true);
  c.parallel.zero_stage = 3;
  EXPECT_TRUE(test::throws_naming([&] { check_layout_options(c, ParallelDims(c.parallel, 1, "test")); },
                                  {"memory.swap = true", "parallel.zero_stage = 3"}));
  c = tiny(true);
  c.memory.swap_blocks = {1, 1};
  EXPECT_TRUE(test::throws_naming([&] { check_layout_options(c, ParallelDims(c.parallel, 1, "test")); },
                                  {"memory.swap_blocks sums to 2", "model.n_layer = 3"}));
  c = tiny(true);
  c.parallel.dp = 2;  // data parallelism of swapped replicas is built (on CPU devices)
  check_parallel_layout(c, ParallelDims(c.parallel, 2, "test"));
#ifdef TESSERA_WITH_CUDA
  c.train.device = "cuda";  // its host all-reduce would need a Gloo group beside NCCL's
  EXPECT_TRUE(test::throws_naming([&] { check_parallel_layout(c, ParallelDims(c.parallel, 2, "test")); },
                                  {"memory.swap = true with parallel.dp = 2 on cuda", "not implemented yet"}));
#endif
}

}  // namespace
}  // namespace tessera
