// A bf16 pipeline step keeps one bf16 copy of each weight for all the micro-batches it holds
// (parallel/pipeline_step.h, WeightCastCache), measured with the counting CPU allocator
// (memory/host_memory_stats.h): two ranks, GPipe (each rank holds all its micro-batches when its
// backwards begin), a model whose weights outweigh its activations (width 512, 4 tokens a
// micro-batch). A step of 8 micro-batches peaks within half a set of copies of a step of 3 above
// the training state (both peak in an accumulating backward with the set whole), where a set per
// held micro-batch would add five; the memory estimate counts one set for both
// (plan/memory_estimate.h, weight_copy_bytes). The same with the saved activations encoded in int8
// (under saved-tensor hooks), and with grouped-query attention's joined query and key/value weights.
// Under Megatron-SP with tp = 2 the sequence-gathered input projections keep the float32 parameters
// and cast them only while their products run (parallel/tensor/tp_comm.h): no copy of the joined
// query and key/value weights per held micro-batch.
#include <cmath>
#include <cstdio>

#include <torch/types.h>
#include <torch/utils.h>

#include "dist_test.h"
#include "memory/host_memory_stats.h"
#include "model/init.h"
#include "parallel/parallelize.h"
#include "plan/memory_estimate.h"

namespace tessera {
namespace {

Config pipeline_config(int64_t micro_batches, const std::string& codec, int64_t kv_heads) {
  Config c;
  c.model.n_layer = 2;
  c.model.n_head = 4;
  c.model.n_kv_head = kv_heads;
  c.model.n_embd = 512;
  c.model.vocab_size = 256;
  c.model.block_size = 16;
  c.model.dropout = 0;
  c.train.seq_len = 4;
  c.train.batch_size = 1;
  c.train.grad_accum = micro_batches;
  c.train.threads = 1;
  c.parallel.pp = 2;
  c.parallel.pp_schedule = "gpipe";
  c.precision.dtype = "bf16";
  c.memory.activation_compression = codec;
  return c;
}

// This rank's peak above the training state in the second step of config c (the first makes
// AdamW's state), and the estimate's bf16 weight copies for its pipeline rank.
double step_peak(const Config& c, comm::Mesh& mesh, double* copies) {
  const Layout layout = make_layout(c, mesh.dims());
  *copies = estimate_memory_by_rank(c, layout).at(static_cast<size_t>(mesh.coord().pp)).weight_copy_bytes;
  torch::manual_seed(1);
  auto parallel = parallelize(TransformerLM(c.model, ModelStage{}, at::TensorOptions().device(at::kMeta)), &mesh, c,
                              layout, mesh.device(), draw_model_seed());
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  std::vector<Batch> batches;
  for (int64_t m = 0; m < c.train.grad_accum; ++m) {
    const at::Tensor tokens = at::randint(c.model.vocab_size, {1, c.train.seq_len + 1}, gen, at::kLong);
    batches.push_back({tokens.narrow(1, 0, c.train.seq_len), tokens.narrow(1, 1, c.train.seq_len)});
  }
  parallel->runner().run(batches, 1e-3, {});  // AdamW's state exists from here on
  const int64_t state = host_memory::current();
  host_memory::reset_peak();
  parallel->runner().run(batches, 1e-3, {});
  return static_cast<double>(host_memory::peak() - state);
}

TEST(PipelineWeightCopies, ABf16StepKeepsOneCopyOfEachWeightForAllItsMicroBatches) {
  test::Ranks ranks(2);
  if (!ranks.is_worker()) {
    ranks.expect_success();
    return ranks.print_lines("rank ");
  }
  host_memory::install();
  auto mesh = ranks.connect(pipeline_config(8, "none", 4).parallel);  // every run's layout
  // Also with the saved activations encoded (int8): the saved-tensor hooks keep a weight's copy, so
  // the next micro-batch finds it (memory/saved_activations.h); and with grouped-query attention,
  // whose query and key/value weights are joined into one product's operand (cast_joined).
  struct Case {
    std::string codec;
    int64_t kv_heads;
  };
  for (const Case& k : {Case{"none", 4}, Case{"int8", 4}, Case{"none", 2}}) {
    double copies3 = 0, copies8 = 0;
    const double three = step_peak(pipeline_config(3, k.codec, k.kv_heads), *mesh, &copies3);
    const double eight = step_peak(pipeline_config(8, k.codec, k.kv_heads), *mesh, &copies8);
    std::printf("rank %lld: bf16, activations %s, %lld key/value heads: step peak above the training state: "
                "3 micro-batches %.2f MB, 8 micro-batches %.2f MB; one set of bf16 weight copies (the estimate) %.2f MB\n",
                static_cast<long long>(ranks.rank()), k.codec.c_str(), static_cast<long long>(k.kv_heads), three / 1e6,
                eight / 1e6, copies8 / 1e6);
    ASSERT_GT(copies8, 0);
    EXPECT_EQ(copies3, copies8);
    EXPECT_LT(std::abs(eight - three), 0.5 * copies8) << k.codec << ", " << k.kv_heads << " key/value heads";
  }
}

TEST(PipelineWeightCopies, MegatronSpKeepsNoCopyOfTheJoinedQueryAndKeyValueWeightsPerMicroBatch) {
  test::Ranks ranks(4);
  if (!ranks.is_worker()) {
    ranks.expect_success();
    return ranks.print_lines("rank ");
  }
  host_memory::install();
  auto config = [](int64_t micro_batches) {
    Config c = pipeline_config(micro_batches, "none", 2);
    c.parallel.tp = 2;
    c.parallel.megatron_sp = true;
    return c;
  };
  auto mesh = ranks.connect(config(8).parallel);
  double copies3 = 0, copies8 = 0;
  const double three = step_peak(config(3), *mesh, &copies3);
  const double eight = step_peak(config(8), *mesh, &copies8);
  // What a float32 join of this rank's query and key/value rows (its 2 query heads and 1 key/value
  // head of 128) kept by each of the 5 more held micro-batches would add: a block a stage.
  const double join = 4.0 * (2 * 128 + 2 * 128) * 512;
  std::printf("rank %lld: bf16, pp2 x tp2 Megatron-SP, 2 key/value heads of 4: step peak above the training state: "
              "3 micro-batches %.2f MB, 8 micro-batches %.2f MB; a join per held micro-batch would add %.2f MB\n",
              static_cast<long long>(ranks.rank()), three / 1e6, eight / 1e6, 5 * join / 1e6);
  EXPECT_EQ(copies3, copies8);
  EXPECT_LT(std::abs(eight - three), 0.5 * 5 * join);
}

}  // namespace
}  // namespace tessera
