// parallelize_tensor (parallel/tensor/tensor_parallel.h) on a tiny GPT (2 layers, 4 heads, width 32,
// vocabulary 64, dropout 0) and the same shape with arch linear (lightning attention: the heads'
// decays must follow the head split; GLU MLP) at tp = 2 and 4, megatron_sp off and on:
// - the gradient shares (gradient_shares.h) differ between ranks after backward and are summed in
//   one all-reduce of their bytes; then replicated parameters' gradients are bitwise equal on all
//   tp ranks;
// - the bytes each rank sends per step equal the formulas of parallelize.h;
// - gather_tensor, parameter by parameter, reproduces the unsharded parameters exactly, also after a step
//   of SGD on both models (within 1e-6); so also with Llama's blocks and fewer key/value heads than
//   ranks (kv_proj replicated, its gradient a share until summed among only the ranks sharing a
//   head, whose all-reduce sends 2 (R - 1) / R of the rank's kv_proj bytes);
// - refusals that only show at run time.
// That the sharded model trains as one process does (loss, gradient norm, every gradient and the
// parameters, also with checkpointing and bf16) is the equivalence harness's, rows tp*.
#include <numeric>

#include <ATen/ATen.h>
#include <torch/types.h>
#include <torch/utils.h>

#include "distributed/dist_test.h"
#include "model/transformer.h"
#include "parallel/tensor/gradient_shares.h"
#include "parallel/tensor/tensor_parallel.h"
#include "test_util.h"

namespace tensor_parallel_model_test {  // named: the unity batch holds test_tp_comm.cpp and test_vocab_parallel.cpp too

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

// Llama's blocks (RMSNorm, rotary positions, SwiGLU, untied head) with `kv_heads` key/value heads.
tessera::ModelOptions tiny_llama(int64_t kv_heads) {
  tessera::ModelOptions o = tiny_gpt();
  o.norm = "rmsnorm";
  o.position = "rope";
  o.mlp = "swiglu";
  o.ffn_hidden = 48;
  o.tie_embeddings = false;
  o.n_kv_head = kv_heads;
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

// Whether `t` is bitwise the same on every rank of tp.
bool same_on_all_ranks(const at::Tensor& t, Group& tp) {
  at::Tensor local = t.contiguous();
  at::Tensor all = at::empty({tp.size() * local.numel()}, local.options());
  tp.all_gather(all, local.view(-1));
  return at::equal(all.view({tp.size(), -1}), local.view({1, -1}).expand({tp.size(), -1}));
}

// One forward and backward of the sharded model: replicated parameters' gradients are bitwise equal
// on every tp rank, and the bytes sent equal the formulas. (That the sharded model computes what
// one process does is the equivalence harness's rows tp*, tests/equivalence/.)
void expect_traffic_and_replicated_grads(Group& tp, const tessera::ModelOptions& opts, bool megatron_sp) {
  const int64_t N = tp.size(), r = tp.rank();
  torch::manual_seed(7);
  tessera::TransformerLM model(opts);
  tessera::parallelize_tensor(model, tp, megatron_sp);
  const Batch batch = make_batch();
  tp.reset_traffic();
  auto out = model->forward(batch.idx, batch.targets);
  out.loss.backward();
  auto traffic = tp.traffic();

  const std::string what = opts.arch + " tp=" + std::to_string(N) + " megatron_sp=" + (megatron_sp ? "on" : "off") +
                           " rank " + std::to_string(r);
  // The gradient shares (gradient_shares.h): after backward each rank's part, different on each
  // rank; summed once, in one all-reduce of their elements.
  const tessera::GradientShares shares = tessera::gradient_shares(model, tp, megatron_sp);
  std::vector<std::pair<std::string, at::Tensor>> share_grads;
  for (const auto& item : model->named_parameters())
    if (shares.holds(item.key())) share_grads.emplace_back(item.key(), item.value().grad());
  EXPECT_EQ(share_grads.empty(), !megatron_sp) << what;
  for (const auto& [name, g] : share_grads) EXPECT_FALSE(same_on_all_ranks(g, tp)) << what << ": " << name << " before the sum";
  tp.reset_traffic();
  shares.sum(share_grads);
  const int64_t share_bytes =
      4 * std::accumulate(share_grads.begin(), share_grads.end(), int64_t{0},
                          [](int64_t n, const std::pair<std::string, at::Tensor>& g) { return n + g.second.numel(); });
  EXPECT_EQ(tp.traffic()["all_reduce"], 2 * (N - 1) * share_bytes / N) << what;
  for (const auto& item : model->named_parameters()) {
    const auto layout = tessera::tensor_parallel_layout(model->parameter_specs().at(item.key()), N);
    ASSERT_TRUE(item.value().grad().defined()) << what << ": " << item.key();
    if (layout.dim < 0) {
      EXPECT_TRUE(same_on_all_ranks(item.value().grad(), tp)) << what << ": grad of " << item.key() << " differs";
    }
  }
  {
    // Bytes per rank of the forward and backward (parallelize.h), A = one [B, T, C] float32
    // activation, P = B T positions: all-reduces of A: the embedding's, the head's backward, and
    // without megatron_sp 4 per layer; the loss: 3 P floats; with megatron_sp 4 all-gathers and 4
    // reduce-scatters of A per layer, one more of each at the head, an all-gather at the
    // embedding's split, the inputs the column-parallel products kept unsplit gathered again for
    // their weight gradients (sequence_gathered_linear: 2 per layer, 1 for the linear kind, whose
    // attention keeps its gathered input, and the head's). The shares summed after it are the
    // replicated parameters the sequence-split region uses: per layer ln_1, ln_2 and the two
    // row-parallel biases, then ln_f; gpt: 6 C L + 2 C floats (LayerNorm weight and bias), linear:
    // 4 C L + C (RMSNorm weight only).
    const int64_t C = opts.n_embd, L = opts.n_layer, A = B * T * C * 4, P = B * T;
    const int64_t region_params = opts.arch == "gpt" ? 6 * C * L + 2 * C : 4 * C * L + C;
    EXPECT_EQ(share_bytes, megatron_sp ? region_params * 4 : 0) << what;
    const int64_t all_reduced = megatron_sp ? A + 3 * P * 4 : (2 + 4 * L) * A + 3 * P * 4;
    EXPECT_EQ(traffic["all_reduce"], 2 * (N - 1) * all_reduced / N) << what;
    const int64_t regathered = (opts.arch == "gpt" ? 2 : 1) * L + 1;
    EXPECT_EQ(traffic["all_gather"], megatron_sp ? (N - 1) * (4 * L + 2 + regathered) * A / N : 0) << what;
    EXPECT_EQ(traffic["reduce_scatter"], megatron_sp ? (N - 1) * (4 * L + 1) * A / N : 0) << what;
  }
}

// Every parameter of a tensor-parallel model gathered whole by its declared split.
std::vector<std::pair<std::string, at::Tensor>> gathered_state(tessera::TransformerLMImpl& model, Group& tp) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : model.named_parameters())
    out.emplace_back(item.key(), tessera::gather_tensor(item.value().contiguous(),
                                                        tessera::tensor_parallel_layout(model.parameter_specs().at(item.key()), tp.size()), tp));
  return out;
}

void expect_gathered_state(tessera::comm::Mesh& mesh, Group& tp, const tessera::ModelOptions& opts) {
  torch::manual_seed(7);
  tessera::TransformerLM single(opts);
  torch::manual_seed(7);
  tessera::TransformerLM model(opts);
  // Fewer key/value heads than ranks: the ranks sharing this rank's head, a group of their own.
  const std::vector<int64_t> kv_ranks = tessera::kv_replica_ranks(model, tp);
  std::unique_ptr<Group> kv_group;
  if (!kv_ranks.empty()) {
    std::string name = "kv";
    for (int64_t r : kv_ranks) name += "/" + std::to_string(r);
    kv_group = mesh.new_group(name, kv_ranks);
  }
  EXPECT_EQ(static_cast<int64_t>(kv_ranks.size()), opts.kv_heads() < tp.size() ? tp.size() / opts.kv_heads() : 0);
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
  if (kv_group) kv_group->reset_traffic();
  const tessera::GradientShares shares = tessera::gradient_shares(model, tp, /*megatron_sp=*/true, kv_group.get());
  for (tessera::TransformerLM* m : {&single, &model}) {
    (*m)->forward(batch.idx, batch.targets).loss.backward();
    if (m == &model) {
      std::vector<std::pair<std::string, at::Tensor>> share_grads;
      for (const auto& item : model->named_parameters()) {
        if (!shares.holds(item.key())) continue;
        share_grads.emplace_back(item.key(), item.value().grad());
        // A shared key/value head's gradient: each rank's query heads' part until summed.
        if (kv_group && item.key().find("attn.kv_proj") != std::string::npos)
          EXPECT_FALSE(same_on_all_ranks(item.value().grad(), *kv_group)) << item.key() << " before the sum";
      }
      shares.sum(share_grads);
    }
    torch::NoGradGuard no_grad;
    for (auto& p : (*m)->parameters()) p.sub_(0.1 * p.grad());
  }
  // The shared heads' gradients go among their R ranks only, once: a ring all-reduce of every
  // layer's kv_proj part, 2 (R - 1) / R of their bytes.
  if (kv_group) {
    const int64_t R = kv_group->size();
    int64_t kv_bytes = 0;
    for (const auto& item : model->named_parameters())
      if (item.key().find("attn.kv_proj") != std::string::npos) kv_bytes += item.value().numel() * 4;
    EXPECT_EQ(kv_group->traffic()["all_reduce"], 2 * (R - 1) * kv_bytes / R) << "n_kv_head " << opts.kv_heads();
  }
  gathered = gathered_state(*model, tp);
  for (size_t i = 0; i < named.size(); ++i)
    EXPECT_TRUE(all_close(gathered[i].second, named[i].value(), 1e-6, 1e-6))
        << "after a step, n_kv_head " << opts.kv_heads() << ": " << gathered[i].first;
}

void run_case(int world) {
  tessera::test::Ranks ranks(world);
  if (!ranks.is_worker()) return ranks.expect_success();
  tessera::ParallelOptions options;
  options.tp = world;
  auto mesh = ranks.connect(options);
  Group& tp = mesh->group("tp");
  for (bool megatron_sp : {false, true}) {
    expect_traffic_and_replicated_grads(tp, tiny_gpt(), megatron_sp);
    expect_traffic_and_replicated_grads(tp, tiny_linear(), megatron_sp);
  }
  expect_gathered_state(*mesh, tp, tiny_gpt());
  for (int64_t kv_heads : {1, 2}) expect_gathered_state(*mesh, tp, tiny_llama(kv_heads));
}

TEST(TensorParallelModel, TwoRanksSendTheFormulasBytesAndGatherWhole) { run_case(2); }
TEST(TensorParallelModel, FourRanksSendTheFormulasBytesAndGatherWhole) { run_case(4); }

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

}  // namespace tensor_parallel_model_test
