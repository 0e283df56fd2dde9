// Multi-rank checkpoints: shards written by 3 "ranks" reassemble into exactly the whole tensors,
// whether each holds even slices or uneven ones (as ZeRO owns them), a gap in the coverage is
// named, a resuming rank reads just its ranges, a missing shard blocks the commit, and a tampered
// shard is refused by name on load. The model, written as one file per rank, gets Hugging Face's
// index, merges on load, and a tensor written by two ranks or a shard missing from the index is
// refused.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include <ATen/ATen.h>

#include "checkpoint/checkpoint.h"
#include "core/error.h"
#include "test_util.h"

namespace tessera::test {
namespace {

NamedTensors optimizer_state() {
  return {{"optim.w.exp_avg", at::arange(35, at::kFloat).view({5, 7})},
          {"optim.w.step", at::full({}, 3.0)},
          {"optim.b.exp_avg_sq", at::arange(4, at::kDouble)},
          {"rng.cpu", at::arange(10, at::kByte)}};
}

CheckpointContents contents() {
  CheckpointContents c;
  c.model = {{"wte.weight", at::ones({3, 2})}};
  c.meta = {{"config", "x"}};
  return c;
}

TEST(ShardedCheckpoint, ModelShardsGetAHuggingFaceIndexAndMergeOnLoad) {
  const std::string dir = fresh_dir("model_shards") + "/checkpoints";
  const std::string partial = prepare_checkpoint_dir(dir, 2);
  for (int64_t r = 0; r < 2; ++r) write_optimizer_shard(partial, r, 2, even_slices(optimizer_state(), r, 2));
  write_model_shard(partial, 0, 2, {{"transformer.wte.weight", at::ones({3, 2}), Region::whole({3, 2})}});
  write_model_shard(partial, 1, 2, {{"transformer.ln_f.weight", at::arange(2, at::kFloat), Region::whole({2})},
                                    {"transformer.ln_f.bias", at::zeros({2}, at::kDouble), Region::whole({2})}});
  CheckpointContents c = contents();
  c.model_shards = 2;
  const std::string committed = commit_checkpoint(dir, 2, c, 2);
  EXPECT_FALSE(std::filesystem::exists(committed + "/model.safetensors"));
  const auto index = nlohmann::json::parse(read_file(committed + "/model.safetensors.index.json"));
  EXPECT_EQ(index["metadata"]["total_size"], 3 * 2 * 4 + 2 * 4 + 2 * 8);
  EXPECT_EQ(index["weight_map"]["transformer.wte.weight"], "model-00001-of-00002.safetensors");
  EXPECT_EQ(index["weight_map"]["transformer.ln_f.bias"], "model-00002-of-00002.safetensors");
  const LoadedCheckpoint loaded = load_checkpoint(committed);
  EXPECT_EQ(loaded.model.size(), 3u);
  EXPECT_TRUE(at::equal(loaded.model.at("transformer.ln_f.weight"), at::arange(2, at::kFloat)));
  EXPECT_EQ(model_source(loaded), committed + "/model-*.safetensors");

  // The same tensor from two ranks is refused at commit.
  const std::string twice = prepare_checkpoint_dir(dir, 3);
  for (int64_t r = 0; r < 2; ++r) {
    write_optimizer_shard(twice, r, 2, even_slices(optimizer_state(), r, 2));
    write_model_shard(twice, r, 2, {{"transformer.wte.weight", at::ones({3, 2}), Region::whole({3, 2})}});
  }
  EXPECT_THROW(commit_checkpoint(dir, 3, c, 2), Error);
}

// Under tensor parallelism each rank writes its part of a split tensor (q, k, v blocks along dim 1
// here, as a transposed c_attn weight is stored) and its optimizer state's part: the index places
// the parts in part_map, a whole read assembles them, a rank of another tp size reads its own part
// (and a ZeRO range of it) alone, and a missing part is named on load.
TEST(ShardedCheckpoint, TensorParallelPartsAssembleAtAnyTpSize) {
  const std::string dir = fresh_dir("model_parts") + "/checkpoints";
  const at::Tensor w = at::arange(48, at::kFloat).view({4, 12});
  const std::string partial = prepare_checkpoint_dir(dir, 5);
  for (int64_t r = 0; r < 2; ++r) {
    const Region part = Region::split({4, 12}, 1, 3, r, 2);
    const at::Tensor values = w.view({4, 3, 2, 2}).select(2, r).reshape(part.part_shape());
    std::vector<TensorSlice> model{{"transformer.h.0.attn.c_attn.weight", values, part}};
    if (r == 0) model.push_back({"transformer.ln_f.weight", at::ones({12}), Region::whole({12})});
    write_model_shard(partial, r, 2, model);
    write_optimizer_shard(partial, r, 2, {{"optim.w.exp_avg", values, part}});
  }
  CheckpointContents c = contents();
  c.model_shards = 2;
  const std::string committed = commit_checkpoint(dir, 5, c, 2);
  const auto index = nlohmann::json::parse(read_file(committed + "/model.safetensors.index.json"));
  EXPECT_EQ(index["part_map"]["transformer.h.0.attn.c_attn.weight"],
            nlohmann::json({"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}));
  EXPECT_EQ(index["weight_map"]["transformer.ln_f.weight"], "model-00001-of-00002.safetensors");
  EXPECT_FALSE(index["weight_map"].contains("transformer.h.0.attn.c_attn.weight"));

  const LoadedCheckpoint loaded = load_checkpoint(committed);
  EXPECT_TRUE(at::equal(loaded.model.at("transformer.h.0.attn.c_attn.weight"), w));
  EXPECT_TRUE(at::equal(loaded.optimizer.at("optim.w.exp_avg"), w));
  const Region third = Region::split({4, 12}, 1, 3, 2, 4);  // tp 4, rank 2: columns 2, 6, 10 of each row
  EXPECT_TRUE(at::equal(read_model_region(loaded, "transformer.h.0.attn.c_attn.weight", third),
                        w.view({4, 3, 4, 1}).select(2, 2).reshape({-1})));
  const LoadedCheckpoint ranged = load_checkpoint(committed, true, {{"optim.w.exp_avg", third.sub(2, 7)}});
  EXPECT_TRUE(at::equal(ranged.optimizer.at("optim.w.exp_avg"), w.view({4, 3, 4, 1}).select(2, 2).reshape({-1}).narrow(0, 2, 5)));

  // Rank 1's part of the model missing: the index and the shards disagree, or the parts leave a gap.
  const std::string gap = prepare_checkpoint_dir(dir, 6);
  for (int64_t r = 0; r < 2; ++r) {
    const Region part = Region::split({4, 12}, 1, 3, 0, 2);  // both ranks write rank 0's part
    write_model_shard(gap, r, 2, {{"transformer.h.0.attn.c_attn.weight", at::zeros(part.part_shape()), part}});
    write_optimizer_shard(gap, r, 2, {});
  }
  const std::string bad = commit_checkpoint(dir, 6, c, 2);
  EXPECT_TRUE(throws_naming([&] { load_checkpoint(bad); },
                            {"model.safetensors.index.json", "transformer.h.0.attn.c_attn.weight", "overlap or leave a gap"}));
}

TEST(ShardedCheckpoint, ShardsReassembleIntoTheWholeTensors) {
  const std::string dir = fresh_dir("sharded") + "/checkpoints";
  const std::string partial = prepare_checkpoint_dir(dir, 4);
  for (int64_t r = 0; r < 3; ++r) write_optimizer_shard(partial, r, 3, even_slices(optimizer_state(), r, 3));
  const std::string committed = commit_checkpoint(dir, 4, contents(), 3);
  EXPECT_FALSE(std::filesystem::exists(partial));
  LoadedCheckpoint loaded = load_checkpoint(committed);
  ASSERT_EQ(loaded.optimizer.size(), 4u);
  for (const auto& [name, t] : optimizer_state()) {
    ASSERT_TRUE(loaded.optimizer.count(name)) << name;
    EXPECT_TRUE(at::equal(loaded.optimizer.at(name), t)) << name;
  }
  EXPECT_EQ(loaded.meta["optimizer_shards"], 3);
}

// Rank 0 owns w[0, 30) and the scalar, rank 1 w[30, 35) and all of b, rank 2 nothing of w.
std::vector<TensorSlice> uneven_slices(int64_t rank, bool leave_gap) {
  const NamedTensors whole = optimizer_state();
  const at::Tensor w = whole[0].second.reshape({-1}), b = whole[2].second;
  if (rank == 0) return {{"optim.w.exp_avg", w.narrow(0, 0, leave_gap ? 29 : 30), Region::range({5, 7}, 0, leave_gap ? 29 : 30)},
                         {"optim.w.step", whole[1].second, Region::whole({})}};
  if (rank == 1)
    return {{"optim.w.exp_avg", w.narrow(0, 30, 5), Region::range({5, 7}, 30, 35)},
            {"optim.b.exp_avg_sq", b, Region::whole({4})}};
  return {};
}

TEST(ShardedCheckpoint, UnevenSlicesReassembleAndAGapIsNamed) {
  const std::string dir = fresh_dir("sharded_uneven") + "/checkpoints";
  std::string partial = prepare_checkpoint_dir(dir, 1);
  for (int64_t r = 0; r < 3; ++r) write_optimizer_shard(partial, r, 3, uneven_slices(r, false));
  LoadedCheckpoint loaded = load_checkpoint(commit_checkpoint(dir, 1, contents(), 3));
  ASSERT_EQ(loaded.optimizer.size(), 3u);
  for (const auto& [name, t] : optimizer_state()) {
    if (name != "rng.cpu") {
      EXPECT_TRUE(at::equal(loaded.optimizer.at(name), t)) << name;
    }
  }

  partial = prepare_checkpoint_dir(dir, 2);
  for (int64_t r = 0; r < 3; ++r) write_optimizer_shard(partial, r, 3, uneven_slices(r, true));
  const std::string gap = commit_checkpoint(dir, 2, contents(), 3);
  EXPECT_TRUE(throws_naming([&] { load_checkpoint(gap); }, {"cover 34 of the 35", "optim.w.exp_avg"}));
}

// A resuming rank reads only its ranges (across shard boundaries, or none of a tensor), from a
// sharded and from a single-file checkpoint alike; a shape other than the run's is named.
TEST(ShardedCheckpoint, RangesReadOnlyWhatARankOwns) {
  const std::string dir = fresh_dir("sharded_ranges") + "/checkpoints";
  const std::string partial = prepare_checkpoint_dir(dir, 3);
  for (int64_t r = 0; r < 3; ++r) write_optimizer_shard(partial, r, 3, even_slices(optimizer_state(), r, 3));
  const std::string sharded = commit_checkpoint(dir, 3, contents(), 3);
  CheckpointContents single = contents();
  single.optimizer = optimizer_state();
  const std::string whole_file = save_checkpoint(dir, 4, single);
  const OptimizerRanges ranges{{"optim.w.exp_avg", Region::range({5, 7}, 10, 32)},
                               {"optim.b.exp_avg_sq", Region::range({4}, 0, 0)}};
  for (const std::string& checkpoint : {sharded, whole_file}) {
    LoadedCheckpoint loaded = load_checkpoint(checkpoint, true, ranges);
    EXPECT_TRUE(at::equal(loaded.optimizer.at("optim.w.exp_avg"), at::arange(10, 32, at::kFloat))) << checkpoint;
    EXPECT_EQ(loaded.optimizer.at("optim.b.exp_avg_sq").numel(), 0) << checkpoint;
    EXPECT_TRUE(at::equal(loaded.optimizer.at("optim.w.step"), at::full({}, 3.0))) << checkpoint;
  }
  const OptimizerRanges wrong{{"optim.w.exp_avg", Region::whole({7, 5})}};
  EXPECT_TRUE(throws_naming([&] { load_checkpoint(sharded, true, wrong); },
                            {"optimizer-0-of-3.safetensors", "'optim.w.exp_avg' has shape [5, 7]", "expects [7, 5]"}));
}

// What the elastic launcher restarts from: the step `latest` names, once committed; nothing before
// the first commit or when `latest` names a step directory that is not there.
TEST(ShardedCheckpoint, LatestStepIsTheCommittedOneLatestNames) {
  const std::string dir = fresh_dir("latest_step") + "/checkpoints";
  EXPECT_EQ(latest_checkpoint_step(dir), -1);
  CheckpointContents single = contents();
  single.optimizer = optimizer_state();
  save_checkpoint(dir, 7, single);
  prepare_checkpoint_dir(dir, 9);  // a save under way is not a checkpoint yet
  EXPECT_EQ(latest_checkpoint_step(dir), 7);
  save_checkpoint(dir, 12, single);
  EXPECT_EQ(latest_checkpoint_step(dir), 12);
  std::ofstream(dir + "/latest") << "step_40\n";
  EXPECT_EQ(latest_checkpoint_step(dir), -1);
}

TEST(ShardedCheckpoint, MissingShardBlocksTheCommitAndTamperingIsNamed) {
  const std::string dir = fresh_dir("sharded_bad") + "/checkpoints";
  std::string partial = prepare_checkpoint_dir(dir, 2);
  write_optimizer_shard(partial, 0, 2, even_slices(optimizer_state(), 0, 2));
  EXPECT_TRUE(throws_naming([&] { commit_checkpoint(dir, 2, contents(), 2); }, {"optimizer-1-of-2.safetensors", "missing"}));
  EXPECT_FALSE(std::filesystem::exists(dir + "/step_2"));

  write_optimizer_shard(partial, 1, 2, even_slices(optimizer_state(), 1, 2));
  const std::string committed = commit_checkpoint(dir, 2, contents(), 2);
  {
    std::fstream f(committed + "/optimizer-1-of-2.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-1, std::ios::end);
    f.put('\x7f');
  }
  EXPECT_TRUE(throws_naming([&] { load_checkpoint(committed); }, {"optimizer-1-of-2.safetensors: checksum mismatch"}));
}

// The reader checks each state tensor by the kind its owner declares (StateKinds), not by its
// name: a second moment only where declared one, a counter only where declared one, bytes never;
// without declarations (tessera export) finite values and any integers pass.
// A save that failed on rank 0 while another rank still writes files into the partial directory
// (here without end, faster than remove_all removes them: remove_all alone fails, the directory not
// empty): the directory is gone afterwards and the writer's next file fails to open.
TEST(ShardedCheckpoint, AFailedSavesPartialDirectoryIsRemovedWhileARankStillWrites) {
  const std::string dir = fresh_dir("partial_race") + "/checkpoints";
  for (int attempt = 0; attempt < 20; ++attempt) {
    const std::string partial = prepare_checkpoint_dir(dir, attempt);
    std::atomic<bool> started{false};
    std::atomic<int> written{0};
    std::thread writer([&] {
      for (int i = 0;; ++i) {
        std::ofstream file(partial + "/shard-" + std::to_string(i));
        started = true;
        if (!file) return;
        file << "bytes";
        ++written;
      }
    });
    while (!started) std::this_thread::yield();
    EXPECT_EQ(remove_partial_checkpoint_dir(partial), "");
    writer.join();
    EXPECT_FALSE(std::filesystem::exists(partial)) << "after " << written << " files";
  }
}

TEST(ShardedCheckpoint, StateIsCheckedByTheKindItsOwnerDeclares) {
  const std::string dir = fresh_dir("state_kinds") + "/checkpoints";
  auto save = [&](int64_t step, NamedTensors state) {
    CheckpointContents c = contents();
    c.optimizer = std::move(state);
    return save_checkpoint(dir, step, c);
  };
  const std::string negative = save(1, {{"opt.v", at::full({3}, -1.0)}, {"opt.n", at::full({}, 2, at::kLong)}});
  auto kinds_of = [](StateKind v, StateKind n) {
    return StateKinds{[v, n](const std::string& name) { return name == "opt.v" ? v : n; }, {}};
  };
  EXPECT_TRUE(throws_naming([&] { load_checkpoint(negative, true, {}, true, kinds_of(StateKind::non_negative, StateKind::counter)); },
                            {"optimizer.safetensors", "'opt.v'", "negative entries"}));
  EXPECT_NO_THROW(load_checkpoint(negative, true, {}, true, kinds_of(StateKind::real, StateKind::counter)));
  EXPECT_NO_THROW(load_checkpoint(negative));  // undeclared: finite, any integer
  EXPECT_TRUE(throws_naming([&] { load_checkpoint(negative, true, {}, true, kinds_of(StateKind::real, StateKind::real)); },
                            {"'opt.n'", "dtype Long"}));
  const std::string below = save(2, {{"opt.v", at::zeros({3})}, {"opt.n", at::full({}, -4, at::kLong)}});
  EXPECT_TRUE(throws_naming([&] { load_checkpoint(below, true, {}, true, kinds_of(StateKind::real, StateKind::counter)); },
                            {"counter 'opt.n' is negative"}));
  EXPECT_NO_THROW(load_checkpoint(below, true, {}, true, kinds_of(StateKind::real, StateKind::bytes)));
  const std::string nan = save(3, {{"opt.v", at::full({3}, NAN)}, {"opt.n", at::zeros({1}, at::kByte)}});
  EXPECT_TRUE(throws_naming([&] { load_checkpoint(nan); }, {"'opt.v'", "NaN"}));
  EXPECT_NO_THROW(load_checkpoint(nan, true, {}, true, kinds_of(StateKind::bytes, StateKind::bytes)));
}

}  // namespace
}  // namespace tessera::test
