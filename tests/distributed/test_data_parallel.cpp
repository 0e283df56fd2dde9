// DataParallel (ZeRO stages 0-3) below the layout harness: what its rows (tests/equivalence/,
// every stage, accumulation, checkpointing, compression and MoE against one process, gradients
// included) cannot see. On 1 and 2 ranks: which micro-batches communicate, reductions overlapping
// backward, the bytes each stage keeps, offload against none exactly, and the refusals; on 4 ranks:
// stage 3's whole optimizer state against the single process and its resharding to 2 ranks.
//
// Every run trains a tiny GPT (2 blocks, width 32, vocabulary 64, no biases, fp32) for 20 steps
// with AdamW (weight decay 0.1 on matrices only), a cosine schedule and gradient clipping at 1.0
// (active in the first steps). Step s's global batch is drawn from seed 1000 + s on every rank;
// with N ranks and M micro-batches of B rows, rank r takes rows [r M B, (r + 1) M B) and
// micro-batch m the rows [m B, (m + 1) B) of those. The reference trains the same initial model in
// the same process on the whole global batch at once, without DataParallel (so it is also the
// M = 1 run with an M-times larger batch). Compared per step: the dp mean of the ranks' losses and
// the gradient norm; at the end: every parameter (and, for stage 3 on 4 ranks, the optimizer state).
//
// Tolerances, against the measured worst case over all runs (the runs differ only in float32
// summation order: the batch mean per rank then over ranks, the clipping norm over shards):
//   losses, gradient norms   1e-6 relative          measured 2.3e-7
//   parameters               1e-6 + 1e-5 |p|        measured |diff| 2.8e-7
//   optimizer state          2e-6 max|t| + 1e-4 |t| measured 5% of that bound
// ZeRO-Offload (parallel.offload) is compared with the same stage without it: only where AdamW's
// leaves live differs, so on a CPU device losses, norms, parameters and optimizer state are equal
// exactly (a CUDA case, labelled gpu, compares within 1e-5 relative losses and 1e-5 + 1e-4 |p|
// parameters, chosen and not measured: the host's AdamW kernel rounds unlike the device's).
// Two choices keep float32 rounding from growing into visible differences: no biases (the key
// bias of attention has an exactly zero gradient, and Adam turns its rounding noise into lr-sized
// steps), and lr 3e-3 (at 1e-2 this model's training amplifies any rounding difference about 10x
// per step after step 10, even between two plain all-reduce layouts).
#include <algorithm>
#include <chrono>
#include <set>
#include <thread>

#include <ATen/ATen.h>
#include <torch/types.h>
#include <torch/utils.h>

#include "dist_test.h"
#include "memory/host_memory_stats.h"
#include "model/transformer.h"
#include "optim/clipping.h"
#include "optim/optimizer.h"
#include "parallel/data/data_parallel.h"
#include "test_util.h"

namespace tessera {
namespace {

constexpr int64_t kRows = 2;            // rows per rank per micro-batch
constexpr int64_t kSteps = 20;          // steps of each run
constexpr int64_t kScheduleSteps = 30;  // the schedule's length (the resharding test continues to 30)
constexpr double kLossRtol = 1e-6;
constexpr double kParamRtol = 1e-5, kParamAtol = 1e-6;
constexpr double kStateRtol = 1e-4, kStateScaledAtol = 2e-6;  // atol: this times the tensor's largest |value|

ModelOptions tiny_gpt() {
  ModelOptions o;
  o.n_layer = 2;
  o.n_head = 2;
  o.n_embd = 32;
  o.vocab_size = 64;
  o.vocab_multiple = 1;  // DataParallel's mechanics on an unpadded model (padding: test_cli Vocabulary.*)
  o.block_size = 16;
  o.bias = false;
  return o;
}

OptimOptions adamw() {
  OptimOptions o;
  o.lr = 3e-3;
  o.warmup_steps = 5;
  o.weight_decay = 0.1;
  o.grad_clip = 1.0;
  return o;
}

TransformerLM fresh_model() {
  torch::manual_seed(1234);
  return TransformerLM(tiny_gpt());
}

// Step s's global batch: [rows, T + 1] tokens, the same on every rank.
at::Tensor global_batch(int64_t step, int64_t rows) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + step);
  return at::randint(tiny_gpt().vocab_size, {rows, tiny_gpt().block_size + 1}, gen, at::kLong);
}

struct Training {
  std::vector<double> losses, norms;
  std::map<std::string, at::Tensor> params;
  NamedParams optimizer_state;
};

std::map<std::string, at::Tensor> snapshot(TransformerLM& model) {
  std::map<std::string, at::Tensor> out;
  for (const auto& item : model->named_parameters()) out[item.key()] = item.value().detach().cpu().clone();
  return out;
}

// The same through DataParallel, which at stage 3 gathers one unit at a time for it.
std::map<std::string, at::Tensor> snapshot(DataParallel& dp, TransformerLM& model) {
  std::map<std::string, at::Tensor> out;
  auto params = model->named_parameters();
  dp.visit_full_parameters([&](const std::vector<std::string>& names) {
    for (const auto& name : names) out[name] = params[name].detach().cpu().clone();
  });
  return out;
}

// The single process: steps [0, steps) on `rows` rows per step.
Training reference(int64_t rows, int64_t steps) {
  TransformerLM model = fresh_model();
  NamedParams params;
  for (const auto& item : model->named_parameters()) params.emplace_back(item.key(), item.value());
  auto optimizer = make_optimizer(adamw(), params);
  std::vector<at::Tensor> tensors;
  for (const auto& [name, p] : params) tensors.push_back(p);
  Training run;
  for (int64_t s = 0; s < steps; ++s) {
    at::Tensor batch = global_batch(s, rows);
    auto out = model->forward(batch.narrow(1, 0, batch.size(1) - 1), batch.narrow(1, 1, batch.size(1) - 1));
    out.loss.backward();
    run.losses.push_back(out.loss.item<double>());
    run.norms.push_back(clip_grad_norm(tensors, adamw().grad_clip));
    optimizer->step(learning_rate(adamw(), s, kScheduleSteps));
    optimizer->zero_grad();
  }
  run.params = snapshot(model);
  for (const auto& [name, t] : optimizer->state()) run.optimizer_state.emplace_back(name, t.clone());
  return run;
}

struct DpSetup {
  int64_t stage = 0;
  int64_t micro_batches = 1;
  bool checkpointing = false;
  int64_t rows = kRows;  // per rank per micro-batch
  std::string compression = "none";
  bool offload = false;
  c10::Device device = at::kCPU;
  double grad_clip = adamw().grad_clip;
};

// optimizer_state_slices(), a sharded checkpoint's content: sent nothing, each slice equals its
// range of the whole tensor, and over the ranks every element is in exactly one slice.
void expect_slices_cover(const DataParallel& dp, const NamedParams& whole, comm::Group& group) {
  const int64_t sent = group.bytes_sent();
  const std::vector<TensorSlice> slices = dp.optimizer_state_slices();
  EXPECT_EQ(group.bytes_sent(), sent) << "optimizer_state_slices communicated";
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < whole.size(); ++i) index[whole[i].first] = i;
  at::Tensor covered = at::zeros({static_cast<int64_t>(whole.size())}, at::kLong);
  for (const TensorSlice& slice : slices) {
    ASSERT_TRUE(index.count(slice.name)) << slice.name;
    const at::Tensor& t = whole[index[slice.name]].second;
    EXPECT_EQ(slice.region.shape, t.sizes().vec()) << slice.name;
    EXPECT_FALSE(slice.region.is_split()) << slice.name;
    const at::Tensor part = t.reshape({-1}).narrow(0, slice.region.begin, slice.values.numel());
    EXPECT_TRUE(at::equal(slice.values.reshape({-1}).cpu(), part.cpu())) << slice.name;
    covered[static_cast<int64_t>(index[slice.name])] += slice.values.numel();
  }
  group.all_reduce(covered);
  for (size_t i = 0; i < whole.size(); ++i)
    EXPECT_EQ(covered[static_cast<int64_t>(i)].item<int64_t>(), whole[i].second.numel()) << whole[i].first;
}

// Steps [first, last) under DataParallel, from the fresh model or from `start_params` and
// `start_state` (whole tensors, loaded as a resuming trainer does). With keep_state, the result
// carries full_optimizer_state().
Training train_dp(comm::Group& group, const DpSetup& setup, int64_t first, int64_t last,
                  const std::map<std::string, at::Tensor>& start_params = {},
                  const std::map<std::string, at::Tensor>& start_state = {}, bool keep_state = false) {
  TransformerLM model = fresh_model();
  model->to(setup.device);
  if (setup.checkpointing) model->set_activation_checkpointing("full");
  ParallelOptions parallel;
  parallel.zero_stage = setup.stage;
  parallel.bucket_mb = 0.02;  // several buckets even for this tiny model
  parallel.grad_compression = setup.compression;
  parallel.offload = setup.offload;
  DataParallel dp(model, group, parallel, adamw());
  if (!start_params.empty()) {  // as a trainer resumes: into the model DataParallel already holds
    for (auto& item : model->named_parameters())
      if (dp.keeps_part_of(item.key())) dp.load_parameter(item.key(), start_params.at(item.key()));
    dp.parameters_loaded();
  }
  if (!start_state.empty()) dp.load_full_optimizer_state(start_state, "test state");

  const int64_t n = group.size(), m_count = setup.micro_batches, b = setup.rows;
  Training run;
  for (int64_t s = first; s < last; ++s) {
    at::Tensor mine = global_batch(s, n * m_count * b).narrow(0, group.rank() * m_count * b, m_count * b);
    double loss = 0;
    for (int64_t m = 0; m < m_count; ++m) {
      const bool last_micro = m + 1 == m_count;
      const int64_t sent_before = group.bytes_sent();
      at::Tensor rows = mine.narrow(0, m * b, b).to(setup.device);
      auto out = model->forward(rows.narrow(1, 0, rows.size(1) - 1), rows.narrow(1, 1, rows.size(1) - 1));
      at::Tensor scaled = out.loss / static_cast<double>(m_count);
      dp.before_backward(last_micro);
      scaled.backward();
      loss += scaled.item<double>();
      // Stages 0-1 communicate only in the last micro-batch.
      if (!last_micro && setup.stage <= 1) {
        EXPECT_EQ(group.bytes_sent(), sent_before) << "micro-batch " << m;
      }
      // Compressed buckets start from backward's hooks: the barrier is queued behind every one
      // already launched, so their bytes are counted before finish_gradients.
      if (last_micro && setup.compression != "none" && group.size() > 1) {
        group.barrier();
        EXPECT_GT(group.bytes_sent(), sent_before) << "no compressed bucket started during backward";
      }
    }
    dp.finish_gradients();
    run.norms.push_back(dp.clip_grad_norm(setup.grad_clip));
    dp.step(learning_rate(adamw(), s, kScheduleSteps));
    dp.zero_grad();
    at::Tensor mean = at::full({1}, loss, at::kDouble);
    group.all_reduce(mean, comm::ReduceOp::avg);
    run.losses.push_back(mean.item<double>());
  }
  run.params = snapshot(dp, model);
  if (keep_state) {
    run.optimizer_state = dp.full_optimizer_state();
    expect_slices_cover(dp, run.optimizer_state, group);
  }
  return run;
}

// `run` against `ref`'s steps [first, first + run.losses.size()) and final parameters.
struct Tolerance {
  double loss_rtol = kLossRtol, param_rtol = kParamRtol, param_atol = kParamAtol;
};

// `run` against `ref`'s steps [first, first + run.losses.size()) and final parameters.
void expect_matches(const Training& run, const Training& ref, int64_t first, const std::string& what,
                    const Tolerance& tol = {}) {
  SCOPED_TRACE(what);
  ASSERT_EQ(run.params.size(), ref.params.size());
  for (size_t i = 0; i < run.losses.size(); ++i) {
    const size_t s = static_cast<size_t>(first) + i;
    EXPECT_NEAR(run.losses[i], ref.losses[s], tol.loss_rtol * std::abs(ref.losses[s])) << "step " << s;
    EXPECT_NEAR(run.norms[i], ref.norms[s], tol.loss_rtol * std::abs(ref.norms[s])) << "step " << s;
  }
  for (const auto& [name, p] : ref.params)
    EXPECT_TRUE(test::all_close(run.params.at(name), p, tol.param_rtol, tol.param_atol)) << name;
}

// Bitwise equality of two runs (offload against none on a CPU device).
void expect_identical(const Training& run, const Training& ref, size_t first, const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_EQ(run.losses.size() + first, ref.losses.size());
  EXPECT_TRUE(std::equal(run.losses.begin(), run.losses.end(), ref.losses.begin() + first));
  EXPECT_TRUE(std::equal(run.norms.begin(), run.norms.end(), ref.norms.begin() + first));
  for (const auto& [name, p] : ref.params) EXPECT_TRUE(at::equal(run.params.at(name), p)) << name;
  ASSERT_EQ(run.optimizer_state.size(), ref.optimizer_state.size());
  for (size_t i = 0; i < ref.optimizer_state.size(); ++i) {
    const auto& [name, expected] = ref.optimizer_state[i];
    EXPECT_EQ(run.optimizer_state[i].first, name);
    EXPECT_TRUE(at::equal(run.optimizer_state[i].second, expected)) << name;
  }
}

// Offload at stages 1-3, M = 1 and 2, against the same run without it, whole optimizer state
// included, clipping at 0.25 (the norm exceeds it in every step here; 1.0 is never reached on 2
// ranks with M = 2). Then an offloaded run stopped at step 10 and resumed from its whole
// parameters and state (load_parameter, load_full_optimizer_state) continues it exactly.
void offload_matches(comm::Group& group) {
  for (int64_t stage = 1; stage <= 3; ++stage) {
    const std::string what = "offload, stage " + std::to_string(stage);
    for (int64_t m_count : {1, 2}) {
      DpSetup setup{stage, m_count};
      setup.grad_clip = 0.25;
      const Training plain = train_dp(group, setup, 0, kSteps, {}, {}, /*keep_state=*/true);
      setup.offload = true;
      expect_identical(train_dp(group, setup, 0, kSteps, {}, {}, true), plain, 0,
                       what + ", " + std::to_string(m_count) + " micro-batches");
      EXPECT_GT(*std::min_element(plain.norms.begin(), plain.norms.end()), setup.grad_clip) << "clipped every step";
      if (m_count == 2) continue;
      const Training first = train_dp(group, setup, 0, kSteps / 2, {}, {}, true);
      const std::map<std::string, at::Tensor> state(first.optimizer_state.begin(), first.optimizer_state.end());
      expect_identical(train_dp(group, setup, kSteps / 2, kSteps, first.params, state, true), plain, kSteps / 2,
                       what + ", resumed at step 10");
    }
  }
}

int64_t numel_of(const std::vector<at::Tensor>& tensors) {
  int64_t n = 0;
  for (const auto& t : tensors) n += t.numel();
  return n;
}

// ZeRO units of the tiny model: per block, then the rest; S = ceil(numel / N) each.
std::vector<int64_t> shard_sizes(TransformerLM& model, int64_t n) {
  std::vector<int64_t> sizes;
  int64_t in_blocks = 0;
  for (int64_t l = 0; l < model->options().n_layer; ++l) {
    const int64_t numel = numel_of(model->block(l)->parameters());
    in_blocks += numel;
    sizes.push_back((numel + n - 1) / n);
  }
  sizes.push_back((numel_of(model->parameters()) - in_blocks + n - 1) / n);
  return sizes;
}

// This rank's part of the units: the elements it owns and the parameter slices they fall in.
std::pair<int64_t, int64_t> owned_by(TransformerLM& model, int64_t n, int64_t rank) {
  std::vector<std::vector<at::Tensor>> units;
  std::set<const c10::TensorImpl*> in_blocks;
  for (int64_t l = 0; l < model->options().n_layer; ++l) {
    units.push_back(model->block(l)->parameters());
    for (const auto& p : units.back()) in_blocks.insert(p.unsafeGetTensorImpl());
  }
  units.emplace_back();
  for (const auto& p : model->parameters())
    if (!in_blocks.count(p.unsafeGetTensorImpl())) units.back().push_back(p);
  int64_t elements = 0, slices = 0;
  for (const auto& unit : units) {
    const int64_t S = (numel_of(unit) + n - 1) / n;
    int64_t offset = 0;
    for (const auto& p : unit) {
      const int64_t overlap = std::min(offset + p.numel(), (rank + 1) * S) - std::max(offset, rank * S);
      if (overlap > 0) {
        elements += overlap;
        ++slices;
      }
      offset += p.numel();
    }
  }
  return {elements, slices};
}

// Reductions run while backward does (a barrier queued after backward finds them done, before
// finish_gradients), each gradient element is sent once by the ring volumes of comm/group.h, and
// what each stage keeps between steps is exactly what the counting CPU allocator
// (memory/host_memory_stats.h) sees live after a step, against what the model held before
// DataParallel:
//   stage 0   4P parameters + 4P gradient buckets + AdamW (8 bytes per element, a float32 step
//             per parameter)
//   stage 1   4NS flat units + 4P buckets + AdamW over this rank's slices
//   stage 2   4NS + 4S gradient shards + AdamW over the slices
//   stage 3   4S own shards + 4S gradient shards + AdamW over the slices: every unit, the ends'
//             included, is released between passes; visit_full_parameters() holds one unit
//             gathered at a time
// (S = this rank's shard of all units, P = the parameters). Offload (stages 1-3) changes neither
// the traffic nor the total on a CPU device: AdamW's state moves to the host, and the host adds a
// float32 master and gradient per shard element (8S).
void expect_overlap_and_memory(comm::Group& group, bool offload = false) {
  host_memory::install();
  const int64_t n = group.size();
  for (int64_t stage = offload ? 1 : 0; stage <= 3; ++stage) {
    SCOPED_TRACE("stage " + std::to_string(stage) + (offload ? ", offload" : ""));
    TransformerLM model = fresh_model();
    const int64_t P = numel_of(model->parameters());
    const int64_t n_params = static_cast<int64_t>(model->parameters().size());
    const std::vector<int64_t> shards = shard_sizes(model, n);
    int64_t S = 0;
    for (int64_t s : shards) S += s;
    const auto [elements, slices] = owned_by(model, n, group.rank());
    const int64_t before = host_memory::current() - 4 * P;  // the model's parameters are counted below
    ParallelOptions parallel;
    parallel.zero_stage = stage;
    parallel.bucket_mb = 0.02;
    parallel.offload = offload;
    DataParallel dp(model, group, parallel, adamw());
    {
      at::Tensor rows = global_batch(0, n * kRows).narrow(0, group.rank() * kRows, kRows);
      group.reset_traffic();
      auto out = model->forward(rows.narrow(1, 0, 16), rows.narrow(1, 1, 16));
      if (stage == 3) {
        EXPECT_EQ(model->block(0)->parameters()[0].storage().nbytes(), 0u) << "blocks released after forward";
        EXPECT_GT(model->wte->weight.storage().nbytes(), 0u) << "the ends kept for the head's backward";
      }
      dp.before_backward(true);
      out.loss.backward();
      group.barrier();
      auto traffic = group.traffic();
      if (stage <= 1) {
        EXPECT_EQ(traffic["all_reduce"], 2 * (n - 1) * 4 * P / n);
      } else {
        EXPECT_EQ(traffic["reduce_scatter"], (n - 1) * 4 * S);
        EXPECT_EQ(traffic["all_reduce"], 0);
      }
      dp.finish_gradients();
      dp.clip_grad_norm(1.0);
      dp.step(1e-3);
      dp.zero_grad();
    }
    const int64_t adamw_sharded = 8 * elements + 4 * slices;
    const int64_t expected = stage == 0   ? 4 * P + 4 * P + 8 * P + 4 * n_params
                             : stage == 1 ? 4 * n * S + 4 * P + adamw_sharded
                             : stage == 2 ? 4 * n * S + 4 * S + adamw_sharded
                                          : 4 * S + 4 * S + adamw_sharded;
    EXPECT_EQ(host_memory::current() - before, expected + (offload ? 8 * S : 0));
    if (stage == 3) {
      EXPECT_EQ(model->wte->weight.storage().nbytes(), 0u) << "the ends released between passes";
      // Visiting the parameters gathers one unit at a time (4N bytes per shard element of it)
      // and releases it again.
      size_t unit = 0;
      dp.visit_full_parameters([&](const std::vector<std::string>&) {
        ASSERT_LT(unit, shards.size());
        EXPECT_EQ(host_memory::current() - before, expected + (offload ? 8 * S : 0) + 4 * n * shards[unit])
            << "unit " << unit;
        ++unit;
      });
      EXPECT_EQ(unit, shards.size());
      EXPECT_EQ(host_memory::current() - before, expected + (offload ? 8 * S : 0));
    }
  }
}

TEST(DataParallel, OneRankAllStagesMatchSingleProcess) {
  test::Ranks ranks(1);
  if (!ranks.is_worker()) return ranks.expect_success();
  auto mesh = ranks.connect();
  comm::Group& group = mesh->group("dp");
  expect_overlap_and_memory(group);
  offload_matches(group);
  expect_overlap_and_memory(group, /*offload=*/true);

  ParallelOptions offload;  // zero_stage 0
  offload.offload = true;
  EXPECT_TRUE(test::throws_naming([&] { DataParallel dp(fresh_model(), group, offload, adamw()); },
                                  {"parallel.offload", "parallel.zero_stage"}));
  offload.zero_stage = 2;
  OptimOptions adafactor = adamw();
  adafactor.name = "adafactor";
  EXPECT_TRUE(test::throws_naming([&] { DataParallel dp(fresh_model(), group, offload, adafactor); },
                                  {"parallel.offload", "optim.name"}));

  ParallelOptions parallel;
  parallel.zero_stage = 1;
  EXPECT_TRUE(test::throws_naming([&] { DataParallel dp(fresh_model(), group, parallel, adafactor); },
                                  {"parallel.zero_stage", "optim.name"}));
  parallel.grad_compression = "bf16";
  EXPECT_TRUE(test::throws_naming([&] { DataParallel dp(fresh_model(), group, parallel, adamw()); },
                                  {"parallel.grad_compression", "parallel.zero_stage"}));
}

// ZeRO-2 (and 3) flatten a unit's gradients beside at most one older reduce-scatter in flight
// (data_parallel_reduce.cpp). Rank 1 starts its backward a second after rank 0, so none of rank 0's
// reduce-scatters can end before then and rank 0 keeps every one the window allows: two, each its
// flat input and shard (1.5U for a unit of U bytes at two ranks). Its blocks' gradients dwarf the
// activations of 4 tokens, so its backward's peak above what it held before is the larger of
// a unit's gradients complete beside two reductions (U + 3U) and a unit being flattened (held
// twice) beside one (2U + 1.5U): 4U, and the ends' gradients (0.02U). With the oldest reduction
// waited for only after the flattening, the flattening held 2U + 3U: 5U (4.96U measured).
TEST(DataParallel, AUnitIsFlattenedBesideAtMostOneOlderReduction) {
  test::Ranks ranks(2);
  if (!ranks.is_worker()) return ranks.expect_success();
  host_memory::install();
  auto mesh = ranks.connect();
  comm::Group& group = mesh->group("dp");
  ModelOptions o = tiny_gpt();
  o.n_layer = 4;
  o.n_embd = 256;
  o.block_size = 4;
  torch::manual_seed(7);
  TransformerLM model(o);
  const double U = 4.0 * static_cast<double>(numel_of(model->block(0)->parameters()));
  ParallelOptions parallel;
  parallel.zero_stage = 2;
  DataParallel dp(model, group, parallel, adamw());
  at::Tensor tokens = at::randint(o.vocab_size, {1, o.block_size + 1}, at::kLong);
  auto out = model->forward(tokens.narrow(1, 0, o.block_size), tokens.narrow(1, 1, o.block_size));
  dp.before_backward(true);
  if (group.rank() == 1) std::this_thread::sleep_for(std::chrono::seconds(1));
  const int64_t before = host_memory::current();
  host_memory::reset_peak();
  out.loss.backward();
  const double above = static_cast<double>(host_memory::peak() - before) / U;
  dp.finish_gradients();
  if (group.rank() == 0) {
    EXPECT_GT(above, 3.5) << "two reductions were in flight while a unit's gradients were complete (units of U)";
    EXPECT_LT(above, 4.5) << "at most one older reduction beside a unit being flattened (units of U)";
  }
}

// What the harness's rows (tests/equivalence/) cannot see: stages 0-1 send nothing before the
// last micro-batch and fp16-compressed buckets start during backward (both checked inside
// train_dp), the overlap and memory of every stage, and offload against none, exactly.
TEST(DataParallel, TwoRanksQuietMicroBatchesOverlapMemoryAndOffload) {
  test::Ranks ranks(2);
  if (!ranks.is_worker()) return ranks.expect_success();
  auto mesh = ranks.connect();
  comm::Group& group = mesh->group("dp");
  for (int64_t stage = 0; stage <= 1; ++stage) train_dp(group, {stage, 2}, 0, 2);
  DpSetup fp16;
  fp16.compression = "fp16";
  train_dp(group, fp16, 0, 2);
  expect_overlap_and_memory(group);
  offload_matches(group);
  expect_overlap_and_memory(group, /*offload=*/true);
}

// Stage 3 on 4 ranks against the single process for 20 steps, optimizer state included, then its
// whole optimizer state and parameters taken to stages 1 and 3 on 2 ranks, which continue as the
// uninterrupted single-process run does.
TEST(DataParallel, FourRanksStagesAndReshardingToTwoRanks) {
  test::Ranks ranks(4, 300);
  if (!ranks.is_worker()) return ranks.expect_success();
  auto mesh = ranks.connect();
  comm::Group& group = mesh->group("dp");
  const Training ref = reference(4 * kRows, kSteps), ref_longer = reference(4 * kRows, kScheduleSteps);
  const Training zero3 = train_dp(group, {3}, 0, kSteps, {}, {}, /*keep_state=*/true);
  expect_matches(zero3, ref, 0, "stage 3");
  ASSERT_EQ(zero3.optimizer_state.size(), ref.optimizer_state.size());
  for (size_t i = 0; i < ref.optimizer_state.size(); ++i) {
    EXPECT_EQ(zero3.optimizer_state[i].first, ref.optimizer_state[i].first);
    const at::Tensor& expected = ref.optimizer_state[i].second;
    const double atol = kStateScaledAtol * expected.abs().max().item<double>();
    EXPECT_TRUE(test::all_close(zero3.optimizer_state[i].second, expected, kStateRtol, atol))
        << ref.optimizer_state[i].first;
  }
  if (group.rank() < 2) {
    auto pair = mesh->new_group("dp_pair", {0, 1});
    std::map<std::string, at::Tensor> state(zero3.optimizer_state.begin(), zero3.optimizer_state.end());
    for (int64_t stage : {1, 3}) {
      const Training resumed = train_dp(*pair, {stage, 1, false, 2 * kRows}, kSteps, kScheduleSteps, zero3.params, state);
      expect_matches(resumed, ref_longer, kSteps, "stage " + std::to_string(stage) + " on 2 ranks, resumed at step 20");
    }
  }
  mesh->world().barrier();
}

// Offload on a CUDA device (CTest label gpu; skipped without one), one rank (a one-member group
// needs no backend): the copy stream's path against the same stage without offload.
TEST(DataParallelCuda, OffloadMatchesNoOffloadOnOneRank) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  comm::Group solo("dp", {0}, 0, nullptr, std::chrono::milliseconds(60000));
  for (int64_t stage = 1; stage <= 3; ++stage) {
    DpSetup setup{stage, 2};
    setup.device = at::Device(at::kCUDA, 0);
    const Training plain = train_dp(solo, setup, 0, kSteps, {}, {}, /*keep_state=*/true);
    setup.offload = true;
    const Training offloaded = train_dp(solo, setup, 0, kSteps, {}, {}, true);
    expect_matches(offloaded, plain, 0, "CUDA offload, stage " + std::to_string(stage), {1e-5, 1e-4, 1e-5});
    for (size_t i = 0; i < plain.optimizer_state.size(); ++i) {
      const at::Tensor expected = plain.optimizer_state[i].second.cpu();
      const double atol = 1e-4 * expected.abs().max().item<double>();
      EXPECT_TRUE(test::all_close(offloaded.optimizer_state[i].second.cpu(), expected, 1e-3, atol))
          << plain.optimizer_state[i].first;
    }
  }
}

}  // namespace
}  // namespace tessera
