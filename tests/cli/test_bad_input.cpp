// Every bad input of the CLI contract ends with one clear message naming the file and key, exit
// code 2, and no existing checkpoint changed or lost.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <regex>
#include <sstream>
#include <thread>

#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors.h"
#include "cli_util.h"
#include "core/fs.h"
#include "core/subprocess.h"

namespace tessera::test {
namespace {

namespace fs = std::filesystem;

std::string write_config(const std::string& name, const std::string& text) {
  std::string path = fresh_dir("cfg_" + name) + "/" + name + ".toml";
  write_file_durable(path, text);
  return path;
}

TEST(BadConfig, MissingFile) { expect_error("train --config /nonexistent/x.toml", {"/nonexistent/x.toml"}); }

TEST(BadConfig, UnknownPresetName) { expect_error("train --config tiny_gtp", {"tiny_gtp", "presets:", "tiny_gpt"}); }

TEST(BadConfig, MalformedTomlNamesFileAndLine) {
  std::string path = write_config("malformed", "[train]\nsteps = 10\nlr = = 3\n");
  expect_error("train --config " + path, {path + ":3", "TOML syntax error"});
}

TEST(BadConfig, MisspeltKeyIsRefusedWithSuggestion) {
  std::string path = write_config("misspelt", "[train]\nstpes = 10\n");
  expect_error("train --config " + path, {path, "train.stpes", "did you mean 'train.steps'"});
}

TEST(BadConfig, UnknownSection) {
  std::string path = write_config("section", "[trian]\nsteps = 10\n");
  expect_error("train --config " + path, {path, "[trian]", "[train]"});
}

TEST(BadConfig, UnknownKeyThroughSet) {
  expect_error("train --config tiny_gpt --set optim.learning_rate=1", {"optim.learning_rate", "--set"});
}

TEST(BadConfig, UnknownModelPreset) {
  expect_error("train --config tiny_gpt --set model.preset=gpt9", {"gpt9", "model.preset", "gpt2_124m"});
}

TEST(BadConfig, WrongTypeAndOutOfRange) {
  expect_error("train --config tiny_gpt --set train.steps=many", {"train.steps must be an integer"});
  expect_error("train --config tiny_gpt --set train.steps=-5", {"train.steps", "-5"});
  expect_error("train --config tiny_gpt --set train.seq_len=4096", {"train.seq_len", "model.block_size"});
  // Upper ends too: these hung in the thread-pool set-up or died of an allocation failure.
  expect_error("train --config tiny_gpt --set train.threads=2000", {"train.threads = 2000", "outside its range [0, 1024]"});
  expect_error("train --config tiny_gpt" + tiny_settings(prepared_corpus()) + " --set train.threads=600",
               {"train.threads = 600", "exceeds this machine's"});
  expect_error("train --config tiny_gpt --set model.n_embd=1e9", {"model.n_embd", "outside its range"});
  expect_error("train --config tiny_gpt --set optim.lr=1e30", {"optim.lr", "outside its range (0, 10]"});
  expect_error("train --config tiny_gpt --set memory.activation_compression=int2",
               {"memory.activation_compression must be none, lossless, bf16, fp8, int8, int4 or adaptive", "int2"});
  expect_error("train --config tiny_gpt --set memory.attention_compression=int2",
               {"memory.attention_compression must be same, none, lossless, bf16, fp8, int8 or int4", "int2"});
  // A line break in a --set value would silently drop the rest of it.
  expect_error("train --config tiny_gpt --set \"$(printf 'train.steps=5\\ndata.path=/tmp')\"",
               {"--set train.steps", "line break"});
}

// The [swarm] keys (tessera peer's): checked with the rest of the config, each named.
TEST(BadConfig, SwarmKeysAreRefusedByName) {
  expect_error("train --config tiny_gpt --set swarm.sync=gossip", {"swarm.sync must be batch or diloco", "gossip"});
  expect_error("train --config tiny_gpt --set swarm.pseudo_gradient_dtype=int4",
               {"swarm.pseudo_gradient_dtype must be fp32, bf16 or int8"});
  expect_error("train --config tiny_gpt --set swarm.target_batch_size=0", {"swarm.target_batch_size", "outside its range"});
  expect_error("train --config tiny_gpt --set swarm.outer_momentum=1", {"swarm.outer_momentum", "outside its range"});
  expect_error("train --config tiny_gpt --set swarm.topk_ratio=0", {"swarm.topk_ratio", "outside its range"});
  expect_error("train --config tiny_gpt --set swarm.topk_ratio=0.01", {"swarm.topk_ratio = 0.01", "diloco only"});
  expect_error("train --config tiny_gpt --set swarm.sync=diloco --set swarm.error_feedback_decay=0.9",
               {"swarm.error_feedback_decay", "pseudo_gradient_rank > 0 only"});
  expect_error("train --config tiny_gpt --set swarm.pseudo_gradient_rank=4", {"swarm.pseudo_gradient_rank = 4", "diloco only"});
  expect_error("train --config tiny_gpt --set swarm.sync=diloco --set swarm.pseudo_gradient_rank=4 --set swarm.topk_ratio=0.1",
               {"swarm.topk_ratio = 0.1", "swarm.pseudo_gradient_rank = 4", "pick one"});
  expect_error("train --config tiny_gpt --set swarm.round_timeout_min_s=10 --set swarm.round_timeout_max_s=5",
               {"swarm.round_timeout_min_s = 10", "swarm.round_timeout_max_s = 5"});
  expect_error("train --config tiny_gpt --set swarm.publish_interval_s=20",
               {"swarm.publish_interval_s = 20", "swarm.record_ttl_s"});
}

// A data directory whose train.bin is replaced by `bytes`.
std::string data_with_train_bin(const std::string& name, const std::string& bytes) {
  std::string dir = fresh_dir("data_" + name);
  for (const char* file : {"val.bin", "tokenizer.json"}) fs::copy_file(prepared_corpus() + "/" + file, dir + "/" + file);
  write_file_durable(dir + "/train.bin", bytes);
  return dir;
}

// Every real-valued key: a value that is not finite, or that float32 turns into inf or 0, is refused
// by name (these trained to "done" with a NaN loss, or never updated).
TEST(BadConfig, RealValuesOutsideFloat32AreRefused) {
  for (const std::string set : {"optim.weight_decay=inf", "optim.lr=1e308", "optim.eps=1e-320",
                                "model.moe_aux_loss_coef=nan", "optim.adafactor_eps1=-inf"}) {
    const std::string key = set.substr(0, set.find('='));
    expect_error("train --config tiny_gpt --set " + set, {key, "not a finite number within float32's normal range"});
  }
}

// A loss that stops being finite ends the run at that step with a message, saving nothing from it.
TEST(BadConfig, NonFiniteLossStopsTheRunNamingTheStep) {
  const std::string out = fresh_dir("nonfinite_run");
  auto r = run_tessera("train --config tiny_gpt" + tiny_settings(prepared_corpus()) +
                       " --set optim.lr=10 --set optim.grad_clip=0 --set optim.warmup_steps=0 --set train.steps=20"
                       " --set model.n_embd=128 --set model.n_head=4 --set model.n_layer=4 --set model.block_size=64"
                       " --set train.seq_len=64"
                       " --set checkpoint.every=1"
                       " --set checkpoint.keep=0 --set eval.every=0 --out " + out);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.output, m, std::regex("error: step ([0-9]+): the (training loss|gradient norm) is "
                                                        "[-a-z]+ \\(not finite\\); the run stops without saving")))
      << r.output;
  const int step = std::stoi(m[1]);
  EXPECT_GT(step, 1);
  EXPECT_TRUE(fs::exists(out + "/checkpoints/step_" + std::to_string(step - 1)));
  EXPECT_FALSE(fs::exists(out + "/checkpoints/step_" + std::to_string(step)));
}

// fp16 steps skipped for overflow are normal, but not without end: precision.max_skipped_steps in a
// row stop the run (here a loss scale of 2^32 that backs off by 1% per skip).
TEST(BadConfig, ConsecutiveFp16SkipsStopTheRun) {
  const std::string out = fresh_dir("fp16_skips");
  auto r = run_tessera("train --config tiny_gpt" + tiny_settings(prepared_corpus()) +
                       " --set precision.dtype=fp16 --set precision.loss_scale_init=4294967296"
                       " --set precision.loss_scale_backoff=0.99 --set precision.max_skipped_steps=3"
                       " --set train.steps=20 --out " + out);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("error: step 3: 3 consecutive fp16 steps overflowed and were skipped "
                          "(precision.max_skipped_steps = 3)"), std::string::npos) << r.output;
}

TEST(BadData, MissingDirectory) {
  expect_error("train --config tiny_gpt --set data.path=/nonexistent/data", {"data.path", "/nonexistent/data"});
}

TEST(BadData, MissingTrainFile) {
  std::string dir = data_with_train_bin("missing", "");
  fs::remove(dir + "/train.bin");
  expect_error("train --config tiny_gpt" + tiny_settings(dir), {dir + "/train.bin"});
}

TEST(BadData, ShortFile) {
  std::string dir = data_with_train_bin("short", std::string(20, 'a'));  // 10 raw uint16 tokens
  expect_error("train --config tiny_gpt" + tiny_settings(dir), {dir + "/train.bin"});
}

TEST(BadData, OddSizedFile) {
  std::string dir = data_with_train_bin("odd", std::string(4097, 'a'));
  expect_error("train --config tiny_gpt" + tiny_settings(dir), {dir + "/train.bin"});
}

// A FIFO (or any file that is not a regular one) where a data or config file belongs is refused at
// once; open(2) on a FIFO with no writer would otherwise wait forever (`timeout` ends the command
// if it does).
TEST(BadData, FifoInsteadOfAFileIsRefusedNotWaitedOn) {
  std::string dir = data_with_train_bin("fifo", "");
  fs::remove(dir + "/train.bin");
  ASSERT_EQ(::mkfifo((dir + "/train.bin").c_str(), 0644), 0);
  auto data = run_tessera_env("timeout 60", "train --config tiny_gpt" + tiny_settings(dir) + " --out " + fresh_dir("fifo_run"));
  EXPECT_EQ(data.exit_code, 2) << data.output;
  EXPECT_NE(data.output.find(dir + "/train.bin: is a FIFO, not a regular file"), std::string::npos) << data.output;
  const std::string config = fresh_dir("fifo_config") + "/run.toml";
  ASSERT_EQ(::mkfifo(config.c_str(), 0644), 0);
  auto cfg = run_tessera_env("timeout 60", "train --config " + config);
  EXPECT_EQ(cfg.exit_code, 2) << cfg.output;
  EXPECT_NE(cfg.output.find(config + ": is a FIFO"), std::string::npos) << cfg.output;
}

TEST(BadData, TruncatedTokenFile) {
  std::string full = slurp(prepared_corpus() + "/train.bin");
  std::string dir = data_with_train_bin("truncated", full.substr(0, full.size() / 2));
  expect_error("train --config tiny_gpt" + tiny_settings(dir), {dir + "/train.bin"});
}

// train.bin truncated while a run reads it (memory-mapped): the next read past the new end raises
// SIGBUS, which ends the run with a message naming the file and exit code 2 instead of a bare
// "Bus error" (exit 135). The checkpoint written before stays.
TEST(BadData, TokenFileTruncatedDuringTheRunStopsItNamingTheFile) {
  const std::string dir = data_with_train_bin("shrinks", slurp(prepared_corpus() + "/train.bin"));
  const std::string out = fresh_dir("shrinks_run");
  const std::string log = out + ".log";
  const pid_t run = spawn_tessera("train --config tiny_gpt" + tiny_settings(dir) +
                                      " --set train.steps=100000 --set checkpoint.every=2 --out " + out,
                                  log);
  // A checkpoint was committed (step_2 itself may already be pruned by then).
  ASSERT_TRUE(wait_until([&] { return fs::exists(out + "/checkpoints/latest"); }, 30)) << slurp(log);
  ASSERT_EQ(::truncate((dir + "/train.bin").c_str(), 4096), 0);
  SuperviseOptions options;
  options.deadline_s = 60;
  const SuperviseResult result = supervise({run}, options);
  const std::string output = slurp(log);
  EXPECT_EQ(result.exits[0].code, 2) << result.exits[0].describe() << "\n" << output;
  EXPECT_NE(output.find("error: " + dir + "/train.bin: the memory-mapped token file shrank"), std::string::npos)
      << output;
  EXPECT_NO_THROW(load_checkpoint(out));  // the latest checkpoint before the fault
}

class BadCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    run_dir_ = fresh_dir(::testing::UnitTest::GetInstance()->current_test_info()->name());
    auto r = run_tessera("train --config tiny_gpt" + tiny_settings(prepared_corpus()) +
                         " --set train.steps=2 --out " + run_dir_);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    step_dir_ = run_dir_ + "/checkpoints/step_2";
  }
  std::string run_dir_, step_dir_;
};

TEST_F(BadCheckpoint, TruncatedFileIsNamed) {
  std::string file = step_dir_ + "/model.safetensors";
  std::string bytes = slurp(file);
  write_file_durable(file, bytes.substr(0, bytes.size() - 64));
  expect_error("train --resume " + step_dir_ + " --out " + run_dir_ + "_r", {file, "truncated"});
  expect_error("generate --checkpoint " + step_dir_, {file});
}

TEST_F(BadCheckpoint, TamperedFileFailsItsChecksum) {
  std::string file = step_dir_ + "/optimizer.safetensors";
  std::string bytes = slurp(file);
  bytes[bytes.size() / 2] ^= 0x5a;
  write_file_durable(file, bytes);
  expect_error("train --resume " + step_dir_ + " --out " + run_dir_ + "_r", {file, "checksum"});
}

TEST_F(BadCheckpoint, ShapeMismatchIsNamedAndTheCheckpointSurvives) {
  std::string before = slurp(step_dir_ + "/model.safetensors") + slurp(step_dir_ + "/meta.json");
  expect_error("train --resume " + run_dir_ + " --set model.n_embd=64 --out " + run_dir_,
               {step_dir_ + "/model.safetensors", "shape"});
  EXPECT_EQ(before, slurp(step_dir_ + "/model.safetensors") + slurp(step_dir_ + "/meta.json"));
  EXPECT_NO_THROW(load_checkpoint(run_dir_));
}

// Rewrites meta.json with `edit` applied and, like a knowing hand would, its checksum recomputed
// (or, with keep_checksum, the old one kept).
void edit_meta(const std::string& step_dir, const std::function<void(nlohmann::json&)>& edit, bool keep_checksum = false) {
  nlohmann::json meta = nlohmann::json::parse(slurp(step_dir + "/meta.json"));
  edit(meta);
  if (!keep_checksum) {
    nlohmann::json without = meta;
    without.erase("meta_checksum");
    meta["meta_checksum"] = checksum(without.dump());
  }
  write_file_durable(step_dir + "/meta.json", meta.dump(2));
}

// Replaces a checkpoint file's tensors and records the new file's size and checksum, so that only
// the values themselves are wrong.
void rewrite_tensors(const std::string& step_dir, const std::string& file,
                     const std::function<void(std::map<std::string, at::Tensor>&)>& edit) {
  const std::string path = step_dir + "/" + file;
  SafetensorsContents contents = read_safetensors(path);
  edit(contents.tensors);
  write_safetensors(path, NamedTensors(contents.tensors.begin(), contents.tensors.end()), contents.metadata);
  edit_meta(step_dir, [&](nlohmann::json& meta) {
    meta["files"][file] = {{"bytes", fs::file_size(path)}, {"checksum", file_checksum(path)}};
  });
}

// meta.json is covered by its own checksum, and each field is validated even when the checksum was
// recomputed: a wrong step re-passed earlier steps or trained "forever" into step_-99999...
TEST_F(BadCheckpoint, TamperedMetaJsonIsRefused) {
  const std::string resume = "train --resume " + step_dir_ + " --set train.steps=4 --out " + run_dir_ + "_r";
  const std::string meta = step_dir_ + "/meta.json", original = slurp(meta);
  edit_meta(step_dir_, [](nlohmann::json& m) { m["step"] = 1; }, /*keep_checksum=*/true);
  expect_error(resume, {meta, "checksum mismatch"});
  for (const nlohmann::json& step : {nlohmann::json(1), nlohmann::json(-1), nlohmann::json(-1e12), nlohmann::json(1e30)}) {
    write_file_durable(meta, original);
    edit_meta(step_dir_, [&](nlohmann::json& m) { m["step"] = step; });
    expect_error(resume, {meta, "step"});
  }
  write_file_durable(meta, original);
  edit_meta(step_dir_, [](nlohmann::json& m) { m["data"]["position"] = 7; });
  expect_error(resume, {meta, "data.position = 7 disagrees with step 2"});
  write_file_durable(meta, original);
  edit_meta(step_dir_, [](nlohmann::json& m) { m["files"]["model.safetensors"]["bytes"] = "many"; });
  expect_error(resume, {meta, "'model.safetensors'", "malformed"});
  write_file_durable(meta, original);
  EXPECT_EQ(run_tessera(resume).exit_code, 0);
}

// A model file with bytes after its last tensor and meta.json re-signed for it, as a buggy writer
// or a hand edit leaves it: `train --resume` read it and trained while `generate` refused it (two
// readers with different checks); both refuse it now, naming the file.
TEST_F(BadCheckpoint, TrailingBytesAreRefusedByResumeAndGenerateAlike) {
  const std::string model = step_dir_ + "/model.safetensors";
  write_file_durable(model, slurp(model) + std::string(8, '\0'));
  edit_meta(step_dir_, [&](nlohmann::json& meta) {
    meta["files"]["model.safetensors"] = {{"bytes", fs::file_size(model)}, {"checksum", file_checksum(model)}};
  });
  expect_error("train --resume " + step_dir_ + " --set train.steps=4 --out " + run_dir_ + "_r", {model, "8 trailing bytes"});
  expect_error("generate --checkpoint " + step_dir_, {model, "8 trailing bytes"});
}

// Tensors of the right size and checksum but wrong values: an integer dtype, NaN weights, a
// negative second moment (each resumed into NaN), a random stream state of the wrong size. Each is
// refused naming the file or the tensor.
TEST_F(BadCheckpoint, WrongDtypeNaNAndNegativeMomentsAreRefused) {
  const std::string resume = "train --resume " + step_dir_ + " --set train.steps=4 --out " + run_dir_ + "_r";
  const std::string model = step_dir_ + "/model.safetensors", optimizer = step_dir_ + "/optimizer.safetensors";
  const std::string model_bytes = slurp(model), optimizer_bytes = slurp(optimizer), meta = slurp(step_dir_ + "/meta.json");
  auto restore = [&] {
    write_file_durable(model, model_bytes);
    write_file_durable(optimizer, optimizer_bytes);
    write_file_durable(step_dir_ + "/meta.json", meta);
  };
  rewrite_tensors(step_dir_, "model.safetensors", [](auto& t) { t["transformer.wte.weight"] = t["transformer.wte.weight"].to(torch::kInt); });
  expect_error(resume, {model, "transformer.wte.weight", "dtype Int"});
  restore();
  rewrite_tensors(step_dir_, "model.safetensors", [](auto& t) { t["transformer.ln_f.weight"][0] = NAN; });
  expect_error(resume, {model, "transformer.ln_f.weight", "NaN"});
  expect_error("generate --checkpoint " + step_dir_, {model, "NaN"});
  restore();
  rewrite_tensors(step_dir_, "optimizer.safetensors", [](auto& t) {
    for (auto& [name, tensor] : t)
      if (name.find("exp_avg_sq") != std::string::npos) tensor.fill_(-1);
  });
  expect_error(resume, {optimizer, "exp_avg_sq", "negative"});
  restore();
  // A random stream state of the wrong size (libtorch's own error said only "RNG state is wrong size").
  rewrite_tensors(step_dir_, "optimizer.safetensors", [](auto& t) {
    t["rng.rank0.shared.cpu"] = t["rng.rank0.shared.cpu"].narrow(0, 0, 100).clone();
  });
  expect_error(resume, {"random stream state 'shared.cpu'", "this build's cpu generator keeps"});
  restore();
  EXPECT_EQ(run_tessera(resume).exit_code, 0);
}

// model.safetensors replaced by a directory, a symlink to /dev/zero or a symlink loop: `train
// --resume` and `generate` end with tessera's own message naming the file and exit 2 (these ended
// in a raw "filesystem error" and exit 1).
TEST_F(BadCheckpoint, ADirectoryDeviceOrSymlinkLoopInPlaceOfAFileIsNamed) {
  const std::string file = step_dir_ + "/model.safetensors";
  const std::string saved = slurp(file);
  const std::vector<std::pair<std::function<void()>, std::string>> cases = {
      {[&] { fs::create_directory(file); }, "is a directory, not a regular file"},
      {[&] { fs::create_symlink("/dev/zero", file); }, "is a device, not a regular file"},
      {[&] { fs::create_symlink(file, file); }, "cannot be read (Too many levels of symbolic links)"},
  };
  for (const auto& [make, says] : cases) {
    fs::remove(file);
    make();
    expect_error("train --resume " + step_dir_ + " --out " + run_dir_ + "_r", {file, says});
    expect_error("generate --checkpoint " + step_dir_, {file, says});
    fs::remove(file);
  }
  write_file_durable(file, saved);
  EXPECT_NO_THROW(load_checkpoint(run_dir_));
}

TEST_F(BadCheckpoint, MissingPath) {
  expect_error("train --resume " + run_dir_ + "/checkpoints/step_99", {"step_99", "does not exist"});
}

// A run killed while it saved step 4 leaves step_4.partial beside the committed step_2 (here a
// half-written model file and no meta.json, what a crash mid-save leaves). Resuming the run
// directory continues from step 2, never reads the partial, writes step 4 over it and commits it.
TEST_F(BadCheckpoint, CrashDuringASaveResumesFromTheLastCommittedStep) {
  const std::string partial = run_dir_ + "/checkpoints/step_4.partial";
  fs::create_directories(partial);
  const std::string model = slurp(step_dir_ + "/model.safetensors");
  write_file_durable(partial + "/model.safetensors", model.substr(0, model.size() / 2));
  auto r = run_tessera("train --resume " + run_dir_ + " --set train.steps=4 --out " + run_dir_ + "_r");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<int64_t> steps;
  for (const auto& line : metrics_lines(run_dir_ + "_r"))
    if (line.contains("loss")) steps.push_back(line["step"]);
  EXPECT_EQ(steps, (std::vector<int64_t>{3, 4})) << r.output;
  EXPECT_EQ(load_checkpoint(run_dir_ + "_r").step, 4);
  // Resumed into the same directory, the stale partial is removed (and said so) and step_4 committed.
  auto same = run_tessera("train --resume " + run_dir_ + " --set train.steps=4 --out " + run_dir_);
  ASSERT_EQ(same.exit_code, 0) << same.output;
  EXPECT_NE(same.output.find("removed " + partial + ": a checkpoint save that did not finish"), std::string::npos)
      << same.output;
  EXPECT_FALSE(fs::exists(partial));
  EXPECT_EQ(load_checkpoint(run_dir_).step, 4);
}

TEST(CheckpointWrite, ReplacingAStepKeepsACompleteCheckpointAndLatestPointsToIt) {
  std::string dir = fresh_dir("ckpt_replace");
  CheckpointContents contents;
  contents.model = {{"w", torch::ones({2, 2})}};
  contents.optimizer = {{"m", torch::zeros({2})}};
  save_checkpoint(dir, 5, contents);
  contents.model = {{"w", torch::full({2, 2}, 3.0)}};
  save_checkpoint(dir, 5, contents);
  auto loaded = load_checkpoint(dir);
  EXPECT_EQ(loaded.step, 5);
  EXPECT_TRUE(torch::equal(loaded.model.at("w"), torch::full({2, 2}, 3.0)));
  for (const auto& entry : fs::directory_iterator(dir)) {
    std::string name = entry.path().filename().string();
    EXPECT_TRUE(name == "step_5" || name == "latest") << "left behind: " << name;
  }
  save_checkpoint(dir, 6, contents);
  save_checkpoint(dir, 7, contents);
  prune_checkpoints(dir, 2);
  EXPECT_FALSE(fs::exists(dir + "/step_5"));
  EXPECT_TRUE(fs::exists(dir + "/step_6") && fs::exists(dir + "/step_7"));
}

// What a save killed part-way leaves: a partial directory, and a moved-aside step whose
// replacement is complete, are removed; a moved-aside step with no replacement is the only copy
// of that step and stays.
TEST(CheckpointWrite, InterruptedSavesAreRemovedAndCompleteCheckpointsKept) {
  const std::string dir = fresh_dir("ckpt_interrupted");
  CheckpointContents contents;
  contents.model = {{"w", torch::ones({2, 2})}};
  save_checkpoint(dir, 5, contents);
  fs::create_directories(dir + "/step_6.partial");
  write_file_durable(dir + "/step_6.partial/model.safetensors", "half");
  fs::create_directories(dir + "/step_5.replaced");
  fs::create_directories(dir + "/step_7.replaced");
  EXPECT_EQ(remove_interrupted_saves(dir), (std::vector<std::string>{"step_5.replaced", "step_6.partial"}));
  EXPECT_FALSE(fs::exists(dir + "/step_6.partial"));
  EXPECT_TRUE(fs::exists(dir + "/step_7.replaced"));
  EXPECT_EQ(load_checkpoint(dir).step, 5);
  EXPECT_TRUE(remove_interrupted_saves(dir + "/none").empty());
}

// The disk fills up during a checkpoint save (the run directory on a small tmpfs): the run stops
// with exit 2 naming the file and "No space left on device", removes the partial checkpoint and
// names the last complete one, which loads and resumes. One process and two (where the ranks'
// writes race: the first error reported must be the real one, not a rank's write into the removed
// directory).
TEST(CheckpointWrite, AFullDiskKeepsThePreviousCheckpointAndSaysWhy) {
  const std::string probe = fresh_dir("disk_full_probe");
  const std::string run = "train --config tiny_gpt" + tiny_settings(prepared_corpus()) +
                          " --set eval.every=0 --set checkpoint.every=1 --set checkpoint.keep=2";
  ASSERT_EQ(run_tessera(run + " --set train.steps=1 --out " + probe).exit_code, 0);
  uintmax_t one_checkpoint = 0;
  for (const auto& entry : fs::recursive_directory_iterator(probe + "/checkpoints/step_1"))
    if (entry.is_regular_file()) one_checkpoint += entry.file_size();
  for (const std::string nproc : {"", " --nproc 2"}) {
    const std::string mount = fresh_dir("disk_full" + std::to_string(nproc.size()));
    // Room for the run's logs and one checkpoint and a half: the second save fills the disk.
    const uintmax_t bytes = one_checkpoint * 3 / 2 + 64 * 1024;
    const CommandResult mounted = run_command("mount -t tmpfs -o size=" + std::to_string(bytes) + " tmpfs " + mount);
    if (mounted.exit_code != 0) GTEST_SKIP() << "cannot mount a tmpfs here (needs root): " << mounted.output;
    const std::string out = mount + "/run";
    const CommandResult r = run_tessera(run + nproc + " --set train.steps=20 --out " + out);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    std::smatch m;
    const std::regex says("checkpoint of step ([0-9]+) not saved: " + out +
                          "/checkpoints/step_[0-9]+\\.partial/[^;]*\\(No space left on device\\); "
                          "removed its partial directory [^;]+; the last complete checkpoint is " + out +
                          "/checkpoints/step_([0-9]+)");
    ASSERT_TRUE(std::regex_search(r.output, m, says)) << r.output;
    const int64_t failed = std::stoll(m[1]), complete = std::stoll(m[2]);
    EXPECT_EQ(complete + 1, failed) << r.output;
    for (const auto& entry : fs::directory_iterator(out + "/checkpoints"))
      EXPECT_EQ(entry.path().filename().string().find(".partial"), std::string::npos) << entry.path();
    EXPECT_EQ(load_checkpoint(out).step, complete);
    // Moved to a disk with room, the run resumes from that checkpoint.
    const std::string moved = fresh_dir("disk_full_moved" + std::to_string(nproc.size()));
    fs::remove_all(moved);
    fs::copy(out, moved, fs::copy_options::recursive);
    EXPECT_EQ(run_command("umount " + mount).exit_code, 0);
    fs::remove(moved + "/run.lock");
    const CommandResult resumed = run_tessera("train --resume " + moved + nproc + " --set train.steps=" +
                                              std::to_string(complete + 2) + " --out " + moved);
    EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
    EXPECT_EQ(load_checkpoint(moved).step, complete + 2);
  }
}

}  // namespace
}  // namespace tessera::test
