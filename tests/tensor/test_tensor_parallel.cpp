// parallelize_tensor (parallel/tensor/tensor_parallel.h) on a tiny GPT (2 layers, 4 heads, width 32,
// vocabulary 64, dropout 0) and the same shape with arch linear (lightning attention: the heads'
// decays must follow the head split; GLU MLP) at tp = 2 and 4, against the same model on one
// process:
// - the loss equals the single-process loss and the logits equal its columns [r V/N, (r+1) V/N);
// - every parameter's gradient equals its slice of the single-process gradient (shard_tensor of
//   it: rows of heads for c_attn, columns for c_proj, vocabulary rows for wte, the whole gradient
//   for replicated parameters), tolerance 1e-5; replicated parameters' gradients are bitwise equal
//   on all tp ranks;
// - all of this with megatron_sp off and on, gpt also with megatron_sp and full activation
//   checkpointing (whose recomputation repeats the forward's collectives), linear also with
//   selective checkpointing;
// - the bytes each rank sends per step equal the formulas of parallelize.h;
// - gather_tensor, parameter by parameter, reproduces the unsharded parameters exactly, also after a step
//   of SGD on both models (within 1e-6);
// - refusals: heads, vocabulary not divisible by tp; MoE; dropout; a sequence not divisible by tp
//   under megatron_sp.
#include <ATen/ATen.h>
#include <torch/torch.h>

#include <sstream>

#include "distributed/dist_test.h"
#include "model/transformer.h"
#include "parallel/tensor/tensor_parallel.h"
#include "precision/autocast.h"
#include "test_util.h"

namespace {

using tessera::comm::Group;
using tessera::test::all_close;

constexpr int64_t B = 2, T = 16;

tessera::ModelOptions tiny_gpt() {
  tessera::ModelOptions o;
  o.vocab_size = 64;
  o.n_layer = 2;
  o.n_head = 4;
  o.n_embd = 32;
  o.block_size = 32;
  return o;
}

// arch linear: RMSNorm, lightning attention with per-head decays (4 heads, 4 distinct slopes),
// GLU MLP, no positions; chunks of 8 tokens so the sequence spans two.
tessera::ModelOptions tiny_linear() {
  tessera::ModelOptions o = tiny_gpt();
  o.arch = "linear";
  o.linear_chunk = 8;
  return o;
}

struct Batch {
  at::Tensor idx, targets;  // [B, T]
};

Batch make_batch() {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(21);
  Batch b{at::randint(64, {B, T}, gen), at::randint(64, {B, T}, gen)};
  b.targets.index_put_({1, 3}, -1);
  return b;
}

struct Reference {
  at::Tensor loss, logits;
  std::map<std::string, at::Tensor> grads;
};

Reference run_single(const tessera::ModelOptions& opts, const std::string& checkpointing) {
  torch::manual_seed(7);
  tessera::TransformerLM model(opts);
  model->set_activation_checkpointing(checkpointing);
  const Batch batch = make_batch();
  auto out = model->forward(batch.idx, batch.targets);
  out.loss.backward();
  Reference ref{out.loss.detach(), out.logits.detach(), {}};
  for (const auto& item : model->named_parameters()) ref.grads[item.key()] = item.value().grad().clone();
  return ref;
}

// Whether `t` is bitwise the same on every rank of tp.
bool same_on_all_ranks(const at::Tensor& t, Group& tp) {
  at::Tensor local = t.contiguous();
  at::Tensor all = at::empty({tp.size() * local.numel()}, local.options());
  tp.all_gather(all, local.view(-1));
  return at::equal(all.view({tp.size(), -1}), local.view({1, -1}).expand({tp.size(), -1}));
}

void expect_matches_single(Group& tp, const tessera::ModelOptions& opts, bool megatron_sp,
                           const std::string& checkpointing) {
  const int64_t N = tp.size(), r = tp.rank();
  const Reference ref = run_single(opts, checkpointing);

  torch::manual_seed(7);
  tessera::TransformerLM model(opts);
  model->set_activation_checkpointing(checkpointing);
  tessera::parallelize_tensor(model, tp, megatron_sp);
  const Batch batch = make_batch();
  tp.reset_traffic();
  auto out = model->forward(batch.idx, batch.targets);
  out.loss.backward();
  auto traffic = tp.traffic();

  const std::string what = opts.arch + " tp=" + std::to_string(N) + " megatron_sp=" + (megatron_sp ? "on" : "off") +
                           " checkpointing=" + checkpointing + " rank " + std::to_string(r);
  EXPECT_TRUE(all_close(out.loss, ref.loss, 1e-5, 1e-5)) << what << ": loss";
  EXPECT_TRUE(all_close(out.logits, ref.logits.chunk(N, -1)[r], 1e-5, 1e-5)) << what << ": logits";
  double worst = 0;  // largest |gradient - expected| over all parameters
  for (const auto& item : model->named_parameters()) {
    const auto layout = tessera::tensor_parallel_layout(model->parameter_specs().at(item.key()));
    const at::Tensor expected = tessera::shard_tensor(ref.grads.at(item.key()), layout, r, N);
    ASSERT_TRUE(item.value().grad().defined()) << what << ": " << item.key();
    worst = std::max(worst, (item.value().grad() - expected).abs().max().item<double>());
    EXPECT_TRUE(all_close(item.value().grad(), expected, 1e-5, 1e-5)) << what << ": grad of " << item.key();
    if (layout.dim < 0)
      EXPECT_TRUE(same_on_all_ranks(item.value().grad(), tp)) << what << ": grad of " << item.key() << " differs";
  }
  if (r == 0)
    std::printf("%s: |loss - single| = %.2e, max |grad - single| = %.2e\n", what.c_str(),
                (out.loss - ref.loss).abs().item<double>(), worst);
  if (checkpointing == "none") {
    // Bytes per rank and step (parallelize.h), A = one [B, T, C] float32 activation, P = B T positions:
    // all-reduces of A: the embedding's, the head's backward, and without megatron_sp 4 per layer;
    // the loss: 3 P floats; with megatron_sp 4 all-gathers and 4 reduce-scatters of A per layer, one
    // more of each at the head, an all-gather at the embedding's split, and the all-reduced gradients
    // of the replicated parameters the sequence-split region uses: per layer ln_1, ln_2 and the two
    // row-parallel biases, then ln_f; gpt: 6 C L + 2 C floats (LayerNorm weight and bias), linear:
    // 4 C L + C (RMSNorm weight only).
    const int64_t C = opts.n_embd, L = opts.n_layer, A = B * T * C * 4, P = B * T;
    const int64_t region_params = opts.arch == "gpt" ? 6 * C * L + 2 * C : 4 * C * L + C;
    const int64_t all_reduced = megatron_sp ? A + 3 * P * 4 + region_params * 4 : (2 + 4 * L) * A + 3 * P * 4;
    EXPECT_EQ(traffic["all_reduce"], 2 * (N - 1) * all_reduced / N) << what;
    EXPECT_EQ(traffic["all_gather"], megatron_sp ? (N - 1) * (4 * L + 2) * A / N : 0) << what;
    EXPECT_EQ(traffic["reduce_scatter"], megatron_sp ? (N - 1) * (4 * L + 1) * A / N : 0) << what;
  }
}

// Every parameter of a tensor-parallel model gathered whole by its declared split.
std::vector<std::pair<std::string, at::Tensor>> gathered_state(tessera::TransformerLMImpl& model, Group& tp) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : model.named_parameters())
    out.emplace_back(item.key(), tessera::gather_tensor(item.value().contiguous(),
                                                        tessera::tensor_parallel_layout(model.parameter_specs().at(item.key())), tp));
  return out;
}

void expect_gathered_state(Group& tp) {
  const tessera::ModelOptions opts = tiny_gpt();
  torch::manual_seed(7);
  tessera::TransformerLM single(opts);
  torch::manual_seed(7);
  tessera::TransformerLM model(opts);
  tessera::parallelize_tensor(model, tp, /*megatron_sp=*/true);
  const auto named = single->named_parameters();
  auto gathered = gathered_state(*model, tp);
  ASSERT_EQ(gathered.size(), named.size());
  for (size_t i = 0; i < named.size(); ++i) {
    EXPECT_EQ(gathered[i].first, named[i].key());
    EXPECT_TRUE(at::equal(gathered[i].second, named[i].value())) << gathered[i].first;
  }

  // One SGD step on both: the gathered parameters follow the single-process update.
  const Batch batch = make_batch();
  for (tessera::TransformerLM* m : {&single, &model}) {
    (*m)->forward(batch.idx, batch.targets).loss.backward();
    torch::NoGradGuard no_grad;
    for (auto& p : (*m)->parameters()) p.sub_(0.1 * p.grad());
  }
  gathered = gathered_state(*model, tp);
  for (size_t i = 0; i < named.size(); ++i)
    EXPECT_TRUE(all_close(gathered[i].second, named[i].value(), 1e-6, 1e-6)) << "after a step: " << gathered[i].first;
}

// Parent side: every rank passed; rank 0's measured differences (lines with "single|") are shown.
void expect_success_and_show(const tessera::test::Ranks& ranks) {
  ranks.expect_success();
  std::istringstream lines(ranks.results().at(0).output);
  for (std::string line; std::getline(lines, line);)
    if (line.find("single|") != std::string::npos) std::printf("%s\n", line.c_str());
}

void run_case(int world) {
  tessera::test::Ranks ranks(world);
  if (!ranks.is_worker()) return expect_success_and_show(ranks);
  tessera::ParallelOptions options;
  options.tp = world;
  auto mesh = ranks.connect(options);
  Group& tp = mesh->group("tp");
  expect_matches_single(tp, tiny_gpt(), false, "none");
  expect_matches_single(tp, tiny_gpt(), true, "none");
  expect_matches_single(tp, tiny_gpt(), true, "full");
  expect_matches_single(tp, tiny_linear(), false, "none");
  expect_matches_single(tp, tiny_linear(), true, "none");
  expect_matches_single(tp, tiny_linear(), false, "selective");
  expect_gathered_state(tp);
}

TEST(TensorParallelModel, TwoRanksMatchOneProcess) { run_case(2); }
TEST(TensorParallelModel, FourRanksMatchOneProcess) { run_case(4); }

// Under bf16 autocast (the training step's precision.dtype = bf16 on CPU) the sharded model runs
// (bf16 activations through the collectives, bf16 logits into the loss) and stays within bf16
// rounding of the single process under the same autocast: the ranks' partial products are
// rounded to bf16 before they are summed, the single process rounds the whole product once.
TEST(TensorParallelModel, Bf16AutocastStaysWithinRounding) {
  tessera::test::Ranks ranks(2);
  if (!ranks.is_worker()) return expect_success_and_show(ranks);
  tessera::ParallelOptions options;
  options.tp = 2;
  auto mesh = ranks.connect(options);
  Group& tp = mesh->group("tp");
  const tessera::ModelOptions opts = tiny_gpt();
  const Batch batch = make_batch();
  torch::manual_seed(7);
  tessera::TransformerLM single(opts);
  torch::manual_seed(7);
  tessera::TransformerLM model(opts);
  tessera::parallelize_tensor(model, tp, /*megatron_sp=*/true);
  std::vector<at::Tensor> losses;
  for (tessera::TransformerLM* m : {&single, &model}) {
    {
      tessera::AutocastGuard guard(at::kCPU, at::kBFloat16);
      auto out = (*m)->forward(batch.idx, batch.targets);
      EXPECT_EQ(out.logits.scalar_type(), at::kBFloat16);
      losses.push_back(out.loss);
    }
    losses.back().backward();
  }
  EXPECT_TRUE(all_close(losses[1], losses[0], 1e-2, 0)) << "loss";
  const auto reference = single->named_parameters();
  double worst = 0;
  for (const auto& item : model->named_parameters()) {
    const auto layout = tessera::tensor_parallel_layout(model->parameter_specs().at(item.key()));
    const at::Tensor expected = tessera::shard_tensor(reference[item.key()].grad(), layout, tp.rank(), 2);
    const double scale = expected.abs().max().item<double>();
    worst = std::max(worst, (item.value().grad() - expected).abs().max().item<double>() / scale);
    EXPECT_TRUE(all_close(item.value().grad(), expected, 0, 0.05 * scale)) << item.key();
  }
  std::printf("bf16 autocast tp=2 rank %lld: max |grad - single| / max |single| = %.2e\n",
              static_cast<long long>(tp.rank()), worst);
}

// What the options cannot split is refused by the layout validator (tests/unit/parallel/
// test_layout.cpp); here what only shows at run time.
TEST(TensorParallelModel, RefusesWhatItCannotSplitAtRunTime) {
  tessera::test::Ranks ranks(4);
  if (!ranks.is_worker()) return ranks.expect_success();
  tessera::ParallelOptions options;
  options.tp = 4;
  auto mesh = ranks.connect(options);
  Group& tp = mesh->group("tp");
  using tessera::test::throws_naming;
  tessera::TransformerLM model(tiny_gpt());
  tessera::parallelize_tensor(model, tp, /*megatron_sp=*/true);
  const at::Tensor idx = at::zeros({1, 6}, at::kLong);
  EXPECT_TRUE(throws_naming([&] { model->forward(idx); }, {"sequence length 6", "parallel.tp = 4"}));
  EXPECT_TRUE(throws_naming([&] { tessera::parallelize_tensor(model, tp, true); }, {"already tensor-parallel"}));
}

}  // namespace
