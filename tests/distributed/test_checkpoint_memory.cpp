// Saving the model without a whole model on any rank (parallel/parallelize.h model_state_shard,
// checkpoint/checkpoint.h write_model_shard), 4 ranks at ZeRO-3, measured with the counting CPU
// allocator (memory/host_memory_stats.h):
// - the peak above the training state while a rank makes and writes its share of the model is no
//   higher than the peak above it during a training step;
// - it peaks below the whole-model path (model_state(), what a single process saves), which
//   gathers every unit at once: the sharded save holds one gathered unit and its own share;
// - the shares cover every tensor exactly once, and each equals the whole model's tensor;
// - loading them into a fresh model reads, on each rank, only the tensors it keeps a part of (fewer
//   than all), peaks no higher than a step, and gives back the saved model.
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include <torch/types.h>
#include <torch/utils.h>

#include "model/init.h"
#include "checkpoint/checkpoint.h"
#include "dist_test.h"
#include "memory/host_memory_stats.h"
#include "parallel/parallelize.h"

namespace tessera {
namespace {

TEST(ShardedModelSave, PeaksNoHigherThanAStepAtZero3OnFourRanks) {
  test::Ranks ranks(4);
  if (!ranks.is_worker()) {  // the measured bytes, from every rank's output
    ranks.expect_success();
    return ranks.print_lines("rank ");
  }
  host_memory::install();
  Config c;
  c.model.n_layer = 4;
  c.model.n_head = 4;
  c.model.n_embd = 64;
  c.model.vocab_size = 2048;  // embeddings 41% of the parameters, as GPT-2 small's 31%
  c.model.block_size = 64;
  c.train.seq_len = 64;
  c.train.threads = 1;
  c.parallel.dp = 4;
  c.parallel.zero_stage = 3;
  auto mesh = ranks.connect(c.parallel);
  torch::manual_seed(1);
  auto parallel = parallelize(TransformerLM(c.model, ModelStage{}, at::TensorOptions().device(at::kMeta)), mesh.get(), c, make_layout(c, mesh->dims()),
                              mesh->device(), draw_model_seed());
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7 + ranks.rank());
  const at::Tensor batch = at::randint(c.model.vocab_size, {2, 65}, gen, at::kLong);
  auto step = [&] { parallel->runner().run({{batch.narrow(1, 0, 64), batch.narrow(1, 1, 64)}}, 1e-3, {}); };
  step();  // AdamW's state exists from here on

  const int64_t state = host_memory::current();
  host_memory::reset_peak();
  step();
  const int64_t step_peak = host_memory::peak() - state;

  const std::string dir = "/tmp/tessera_sharded_save_" + std::to_string(ranks.launch().master_port);
  std::filesystem::create_directories(dir);
  host_memory::reset_peak();
  {
    write_model_shard(dir, ranks.rank(), 4, parallel->model_state_shard());
  }
  const int64_t save_peak = host_memory::peak() - state;
  EXPECT_EQ(host_memory::current(), state) << "the save left memory behind";

  host_memory::reset_peak();
  NamedTensors whole;
  {
    whole = parallel->model_state();
  }
  const int64_t whole_peak = host_memory::peak() - state;
  std::printf("rank %lld: above the training state: step peak %lld B, sharded save peak %lld B, whole-model "
              "state peak %lld B\n",
              static_cast<long long>(ranks.rank()), static_cast<long long>(step_peak),
              static_cast<long long>(save_peak), static_cast<long long>(whole_peak));
  EXPECT_LE(save_peak, step_peak);
  EXPECT_LT(save_peak, whole_peak);

  // Every tensor in exactly one share, equal to the whole model's.
  mesh->world().barrier();
  std::map<std::string, int> seen;
  for (int r = 0; r < 4; ++r) {
    char name[64];
    std::snprintf(name, sizeof name, "/model-%05d-of-00004.safetensors", r + 1);
    for (const auto& [n, t] : read_safetensors(dir + name).tensors) {
      ++seen[n];
      for (const auto& [wn, wt] : whole)
        if (wn == n) {
          EXPECT_TRUE(t.equal(wt)) << n;
        }
    }
  }
  EXPECT_EQ(seen.size(), whole.size());
  for (const auto& [n, count] : seen) EXPECT_EQ(count, 1) << n;

  // Loading back into a fresh model (other initial values): each rank reads only the tensors it
  // keeps a part of, one at a time from its file, with no more memory than a step, and ends with
  // the saved model.
  std::map<std::string, std::string> file_of;
  ModelReader reader;
  for (int r = 0; r < 4; ++r) {
    char name[64];
    std::snprintf(name, sizeof name, "/model-%05d-of-00004.safetensors", r + 1);
    for (const auto& [n, e] : read_safetensors_header(dir + name).tensors) {
      file_of[n] = dir + name;
      reader.names.insert(n);
    }
  }
  torch::manual_seed(99);
  auto fresh = parallelize(TransformerLM(c.model, ModelStage{}, at::TensorOptions().device(at::kMeta)), mesh.get(), c, make_layout(c, mesh->dims()),
                              mesh->device(), draw_model_seed());
  int64_t reads = 0;
  reader.shape = [&](const std::string& n) { return read_safetensors_header(file_of.at(n)).tensors.at(n).shape; };
  reader.read = [&](const std::string& n, const Region& region) {
    ++reads;
    const at::Tensor t = read_safetensors_tensor(file_of.at(n), n);
    EXPECT_EQ(region, Region::whole(t.sizes().vec())) << n << ": no tensor parallelism, whole tensors";
    return t.reshape({-1});
  };
  reader.source = "test shards";
  const int64_t before_load = host_memory::current();
  host_memory::reset_peak();
  fresh->load_model_state(reader);
  const int64_t load_peak = host_memory::peak() - before_load;
  std::printf("rank %lld: loading read %lld of %zu tensors, peak %lld B above the state\n",
              static_cast<long long>(ranks.rank()), static_cast<long long>(reads), reader.names.size(),
              static_cast<long long>(load_peak));
  EXPECT_LT(reads, static_cast<int64_t>(reader.names.size())) << "a ZeRO-3 rank keeps parts of some tensors only";
  EXPECT_LE(load_peak, step_peak);
  for (const auto& [n, t] : fresh->model_state())
    for (const auto& [wn, wt] : whole)
      if (wn == n) {
        EXPECT_TRUE(t.equal(wt)) << n;
      }
  mesh->world().barrier();
  if (ranks.rank() == 0) std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tessera
