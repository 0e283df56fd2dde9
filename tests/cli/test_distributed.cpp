// `tessera train` on several processes, end to end: --nproc and torchrun-style launches give the
// losses of one process with the same global batch; a checkpoint from 4 ranks at ZeRO-3 resumes
// on 2 ranks at ZeRO-1 and on one process; a killed rank stops the run with its name; degrees that
// do not fit the world are refused before anything starts. Which layouts equal one process, in
// loss, gradients and parameters, is the equivalence harness's (tests/equivalence/); the runs here
// check what only the command shows (launch, sampler, checkpoints, validation).
#include <gtest/gtest.h>

#include <regex>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.h"
#include "core/fs.h"
#include "cli_util.h"
#include "fault_util.h"
#include "store_port.h"
#include "core/subprocess.h"
#include "train/stop_request.h"

namespace tessera::test {
namespace {

namespace fs = std::filesystem;

// Tiny settings without dropout (masks would differ between layouts), `steps` steps.
std::string settings(int64_t batch_size, int64_t steps, int64_t heads = 0) {
  return tiny_settings(prepared_corpus()) + " --set model.dropout=0 --set train.batch_size=" +
         std::to_string(batch_size) + " --set train.steps=" + std::to_string(steps) + " --set eval.every=0" +
         (heads > 0 ? " --set model.n_head=" + std::to_string(heads) : "");
}

// One worker on node `node` of two, whose store is on 127.0.0.1:port.
std::string node_launch(int node, int port) {
  return "train --config tiny_gpt --nproc 1 --nnodes 2 --node-rank " + std::to_string(node) +
         " --master 127.0.0.1:" + std::to_string(port);
}


// Same steps, each loss within `rtol` relative (the reduction order of the gradients differs).
void expect_same_losses(const std::map<int64_t, double>& actual, const std::map<int64_t, double>& expected,
                        double rtol, const std::string& what) {
  ASSERT_FALSE(actual.empty()) << what;
  for (const auto& [step, loss] : actual) {
    ASSERT_TRUE(expected.count(step)) << what << ": step " << step;
    EXPECT_NEAR(loss, expected.at(step), rtol * std::abs(expected.at(step))) << what << ": step " << step;
  }
}

TEST(DistributedTrain, TwoRanksMatchOneProcessWithTheSameGlobalBatch) {
  const std::string one = fresh_dir("dp_one"), two = fresh_dir("dp_two"), three = fresh_dir("dp_zero3");
  auto r1 = run_tessera("train --config tiny_gpt" + settings(8, 12) + " --out " + one);
  ASSERT_EQ(r1.exit_code, 0) << r1.output;
  auto r2 = run_tessera("train --config tiny_gpt --nproc 2" + settings(4, 12) + " --out " + two);
  ASSERT_EQ(r2.exit_code, 0) << r2.output;
  EXPECT_NE(r2.output.find("dp=2 tp=1 pp=1 sp=1 ep=1 (world 2), zero_stage 0"), std::string::npos) << r2.output;
  expect_same_losses(losses(two), losses(one), 1e-4, "DDP on 2 ranks");
  expect_same_losses(grad_norms(two), grad_norms(one), 1e-4, "DDP on 2 ranks: gradient norm");
  EXPECT_TRUE(fs::exists(two + "/logs/rank_0.log") && fs::exists(two + "/logs/rank_1.log"));
  auto r3 = run_tessera("train --config tiny_gpt --nproc 2 --set parallel.zero_stage=3" + settings(4, 12) +
                        " --out " + three);
  ASSERT_EQ(r3.exit_code, 0) << r3.output;
  expect_same_losses(losses(three), losses(one), 1e-4, "ZeRO-3 on 2 ranks");
  expect_same_losses(grad_norms(three), grad_norms(one), 1e-4, "ZeRO-3 on 2 ranks: gradient norm");
}

// Two nodes whose --out are different directories (hosts without a shared filesystem): before,
// training ran and the first checkpoint failed after the work ("step_10.partial/optimizer-1-of-2...:
// cannot create"). Now both nodes stop before the first step, naming the rank that cannot see
// rank 0's run directory.
TEST(DistributedTrain, NodesWithoutASharedRunDirectoryAreRefusedAtStart) {
  const std::string a = fresh_dir("unshared_node0"), b = fresh_dir("unshared_node1");
  const int port = store_port();
  std::vector<pid_t> nodes;
  const std::string outs[2] = {a, b};
  for (int node = 0; node < 2; ++node)
    nodes.push_back(spawn_tessera(node_launch(node, port) + settings(4, 20) + " --set checkpoint.every=10 --out " +
                                      outs[node],
                                  outs[node] + "_launcher.out"));
  SuperviseOptions options;
  options.deadline_s = 120;
  options.stop_on_failure = false;
  const SuperviseResult result = supervise(nodes, options);
  EXPECT_FALSE(result.timed_out);
  for (int node = 0; node < 2; ++node) {
    const std::string output = slurp(outs[node] + "_launcher.out");
    EXPECT_EQ(result.exits[node].code, 2) << "node " << node << ":\n" << output;
    EXPECT_NE(output.find("is not shared by all ranks: rank(s) 1 cannot see"), std::string::npos)
        << "node " << node << ":\n" << output;
    EXPECT_NE(output.find("or set checkpoint.gather = true"), std::string::npos)
        << "node " << node << ":\n" << output;
  }
  EXPECT_FALSE(fs::exists(a + "/metrics.jsonl"));  // no step was taken
}

// Two node launchers, each in a working directory of its own, started with the same `args`
// (relative paths: one string names a different directory on each "host", as on machines that
// share no filesystem). Returns each node's exit code; output in <cwd>/launcher.out.
std::vector<int> run_two_nodes(const std::string cwds[2], const std::string& args) {
  const int port = store_port();
  std::vector<pid_t> nodes;
  for (int node = 0; node < 2; ++node) {
    ChildSpec spec;
    spec.argv = {"/bin/sh", "-c",
                 "cd " + cwds[node] + " && exec " + kTesseraBinary + " " + node_launch(node, port) + " " + args};
    spec.output_file = cwds[node] + "/launcher.out";
    nodes.push_back(spawn(spec));
  }
  SuperviseOptions options;
  options.deadline_s = 120;
  options.stop_on_failure = false;
  const SuperviseResult result = supervise(nodes, options);
  EXPECT_FALSE(result.timed_out);
  return {result.exits[0].code, result.exits[1].code};
}

// checkpoint.gather, for hosts without a shared filesystem: each node has its own --out; rank 0
// writes whole checkpoints into its own (rank 1 sends its shards), the run equals one process,
// and a resume where rank 1's node lacks the checkpoint receives it from rank 0 and continues the
// uninterrupted run. A node that resolved another config is refused at start, naming it.
TEST(DistributedTrain, NodesWithoutASharedFilesystemGatherCheckpointsOnRankZero) {
  const std::string one = fresh_dir("gather_one");
  const std::string cwds[2] = {fresh_dir("gather_host0"), fresh_dir("gather_host1")};
  auto single = run_tessera("train --config tiny_gpt" + settings(8, 6) + " --out " + one);
  ASSERT_EQ(single.exit_code, 0) << single.output;
  const std::string gather = settings(4, 6) + " --set checkpoint.gather=true --set checkpoint.every=3 --set checkpoint.keep=0";
  auto codes = run_two_nodes(cwds, gather + " --out run");
  for (int node = 0; node < 2; ++node) ASSERT_EQ(codes[node], 0) << slurp(cwds[node] + "/launcher.out");
  const std::string run0 = cwds[0] + "/run", run1 = cwds[1] + "/run";
  expect_same_losses(losses(run0), losses(one), 1e-4, "2 hosts, gathered checkpoints");
  expect_same_losses(grad_norms(run0), grad_norms(one), 1e-4, "2 hosts, gathered checkpoints: gradient norm");
  for (const char* step : {"step_3", "step_6"}) {
    EXPECT_TRUE(fs::exists(run0 + "/checkpoints/" + step + "/optimizer-1-of-2.safetensors")) << step;
    EXPECT_TRUE(fs::exists(run0 + "/checkpoints/" + step + "/model-00002-of-00002.safetensors")) << step;
  }
  EXPECT_FALSE(fs::exists(run1 + "/checkpoints"));
  EXPECT_FALSE(fs::exists(run1 + "/.gather-rank1"));

  // Resume from step 3: the path exists on host 0 only.
  codes = run_two_nodes(cwds, gather + " --resume run/checkpoints/step_3 --out resumed");
  for (int node = 0; node < 2; ++node) ASSERT_EQ(codes[node], 0) << slurp(cwds[node] + "/launcher.out");
  expect_same_losses(losses(cwds[0] + "/resumed"), losses(one), 1e-4, "resumed on 2 hosts, rank 1 receiving");
  EXPECT_EQ(losses(cwds[0] + "/resumed").begin()->first, 4);
  EXPECT_FALSE(fs::exists(cwds[1] + "/resumed/.received-rank1"));

  // Without gather, host 1 cannot resume from a checkpoint it does not hold: refused by name
  // (and host 0, whose peer never joins, gives up after parallel.timeout_s).
  codes = run_two_nodes(cwds, settings(4, 6) + " --set parallel.timeout_s=5 --resume run/checkpoints/step_3 --out resumed_again");
  EXPECT_EQ(codes[1], 2);
  EXPECT_NE(slurp(cwds[1] + "/launcher.out").find("checkpoint.gather is false"), std::string::npos)
      << slurp(cwds[1] + "/launcher.out");

  // A node whose config differs (here its optim.lr) stops both before the first step.
  codes = run_two_nodes(cwds, gather + " --out differs --set optim.lr=$(( $(pwd | grep -c host1) + 1 ))e-3");
  EXPECT_EQ(codes[0], 2);
  EXPECT_NE(slurp(cwds[0] + "/launcher.out").find("rank(s) 1 resolved another config than rank 0"), std::string::npos)
      << slurp(cwds[0] + "/launcher.out");
}

// train.global_batch_size fixes the windows of every step whatever their split into ranks and
// micro-batches (data/sampler.h): 8 sequences per step as 1 x 8, 1 x 4 x 2 accumulated, 2 ranks x 4,
// and dp 2 x sp 2 x 2 x 2 accumulated give the same losses and gradient norms over 20 steps, and the
// 2-rank run's checkpoint resumed on one process with 2 micro-batches continues the same run.
TEST(DistributedTrain, GlobalBatchSizeGivesOneRunForEveryDecomposition) {
  const std::string whole = fresh_dir("gbs_whole"), accumulated = fresh_dir("gbs_accumulated");
  const std::string ranks = fresh_dir("gbs_ranks"), sequence = fresh_dir("gbs_dp_sp"), resumed = fresh_dir("gbs_resumed");
  auto run = [](const std::string& launch, int64_t batch, const std::string& out, const std::string& extra = "") {
    auto r = run_tessera("train --config tiny_gpt" + launch + settings(batch, 20) +
                         " --set train.global_batch_size=8 --set checkpoint.every=10 --set checkpoint.keep=0" + extra +
                         " --out " + out);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return r.output;
  };
  run("", 8, whole);
  run("", 4, accumulated);
  run(" --nproc 2", 4, ranks);
  run(" --nproc 4", 2, sequence, " --set parallel.sp=2");
  auto r = run_tessera("train --resume " + ranks + "/checkpoints/step_10 --set train.batch_size=4 --out " + resumed);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("global batch changed"), std::string::npos) << r.output;
  const auto expected_loss = losses(whole), expected_norm = grad_norms(whole);
  ASSERT_EQ(expected_loss.size(), 20u);
  // Sequence parallelism sums attention's and the loss's parts in another order: on an AMD EPYC
  // (MKL's zen kernels) step 19's gradient norm spikes to 11.45 (1.3 at the steps around it) and dp 2
  // x sp 2's differs there by 1.8e-4 relative, its losses within 1e-5 at every step.
  struct Case {
    std::string dir, what;
    double norm_rtol;
  };
  for (const Case& c : std::vector<Case>{{accumulated, "1 process, 2 micro-batches of 4", 1e-4},
                                         {ranks, "2 ranks x 4", 1e-4},
                                         {sequence, "dp 2 x sp 2, 2 micro-batches of 2", 5e-4},
                                         {resumed, "2 ranks, resumed at step 10 on 1 process with 2 micro-batches", 1e-4}}) {
    expect_same_losses(losses(c.dir), expected_loss, 1e-5, c.what);
    expect_same_losses(grad_norms(c.dir), expected_norm, c.norm_rtol, c.what + " (grad norm)");
  }
  EXPECT_EQ(losses(resumed).begin()->first, 11);
}

// Two nodes on one machine: two launchers (`--nnodes 2 --node-rank 0|1 --master HOST:PORT`, one
// worker each) form one world of 2 and train as 2 data-parallel ranks of one launcher would: one
// process's losses and gradient norms with the same global batch.
TEST(DistributedTrain, TwoNodeLaunchersFormOneWorld) {
  const std::string one = fresh_dir("nodes_one"), two = fresh_dir("nodes_two");
  auto r1 = run_tessera("train --config tiny_gpt" + settings(8, 6) + " --out " + one);
  ASSERT_EQ(r1.exit_code, 0) << r1.output;
  const int port = store_port();
  std::vector<pid_t> nodes;
  for (int node = 0; node < 2; ++node)
    nodes.push_back(spawn_tessera(node_launch(node, port) + settings(4, 6) + " --out " + two,
                                  two + "_node" + std::to_string(node) + ".out"));
  SuperviseOptions options;
  options.deadline_s = 120;
  const SuperviseResult result = supervise(nodes, options);
  EXPECT_FALSE(result.timed_out);
  for (int node = 0; node < 2; ++node)
    ASSERT_EQ(result.exits[node].code, 0) << "node " << node << ":\n" << slurp(two + "_node" + std::to_string(node) + ".out");
  EXPECT_NE(slurp(two + "_node0.out").find("dp=2 tp=1 pp=1 sp=1 ep=1 (world 2)"), std::string::npos)
      << slurp(two + "_node0.out");
  expect_same_losses(losses(two), losses(one), 1e-4, "2 nodes x 1 worker");
  expect_same_losses(grad_norms(two), grad_norms(one), 1e-4, "2 nodes x 1 worker: gradient norm");
}

TEST(DistributedTrain, ResumesAtAnotherDpSizeAndZeroStage) {
  const std::string full = fresh_dir("reshard_full"), four = fresh_dir("reshard_four");
  const std::string two = fresh_dir("reshard_two"), single = fresh_dir("reshard_single");
  auto uninterrupted = run_tessera("train --config tiny_gpt" + settings(8, 8) + " --out " + full);
  ASSERT_EQ(uninterrupted.exit_code, 0) << uninterrupted.output;
  auto first = run_tessera("train --config tiny_gpt --nproc 4 --set parallel.zero_stage=3" + settings(2, 8) +
                           " --set checkpoint.every=4 --set checkpoint.keep=0 --out " + four);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  // Same global batch (2 x 4 = 4 x 2 = 8 x 1), so the continuation must match the single run.
  auto on_two = run_tessera("train --resume " + four + "/checkpoints/step_4 --nproc 2 --set parallel.zero_stage=1"
                            " --set train.batch_size=4 --out " + two);
  ASSERT_EQ(on_two.exit_code, 0) << on_two.output;
  auto on_one = run_tessera("train --resume " + four + "/checkpoints/step_4 --set parallel.zero_stage=0"
                            " --set train.batch_size=8 --out " + single);
  ASSERT_EQ(on_one.exit_code, 0) << on_one.output;
  const auto expected = losses(full);
  expect_same_losses(losses(two), expected, 1e-4, "4 ranks ZeRO-3 -> 2 ranks ZeRO-1");
  expect_same_losses(losses(single), expected, 1e-4, "4 ranks ZeRO-3 -> 1 process");
  expect_same_losses(grad_norms(two), grad_norms(full), 1e-4, "4 ranks ZeRO-3 -> 2 ranks ZeRO-1: gradient norm");
  expect_same_losses(grad_norms(single), grad_norms(full), 1e-4, "4 ranks ZeRO-3 -> 1 process: gradient norm");
  EXPECT_EQ(losses(two).begin()->first, 5);

  // The 4-rank checkpoint at step 8, exported whole, holds the single run's model and optimizer.
  const std::string model_file = four + "/export_model.safetensors", optim_file = four + "/export_optim.safetensors";
  auto exported = run_tessera("export --checkpoint " + four + "/checkpoints/step_8 --out " + model_file +
                              " --optimizer " + optim_file);
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  EXPECT_NE(exported.output.find("(4 shards)"), std::string::npos) << exported.output;
  const auto reference_model = read_safetensors(full + "/checkpoints/step_8/model.safetensors").tensors;
  const auto reference_optim = read_safetensors(full + "/checkpoints/step_8/optimizer.safetensors").tensors;
  const auto model = read_safetensors(model_file).tensors;
  const auto optim = read_safetensors(optim_file).tensors;
  ASSERT_EQ(model.size(), reference_model.size());
  // Adam turns the different reduction order's rounding into parameter differences of ~1e-5 on
  // the biases (their gradients are near zero); a misplaced shard would be off by ~1e-2.
  for (const auto& [name, t] : reference_model)
    EXPECT_TRUE(all_close(model.at(name), t, 1e-3, 1e-4)) << name;
  // Moments: measured within 2.5e-5 of each tensor's largest |value| (rounding carried through 8
  // Adam steps); a misplaced shard is off by the values themselves.
  for (const auto& [name, t] : reference_optim) {
    if (name.rfind("optim.", 0) != 0) continue;
    ASSERT_TRUE(optim.count(name)) << name;
    EXPECT_TRUE(all_close(optim.at(name), t, 1e-3, 1e-4 * t.abs().max().item<double>())) << name;
  }
}

// A checkpoint of the 3D layout tp 2 x pp 2 x dp 2 at ZeRO-3 (8 ranks) resumes at pp 4 (4 ranks) and
// on one process, optimizer state included, and both continue the uninterrupted one-process run
// with the same global batch (2 rows x 2 dp x 2 micro-batches = 2 x 4 micro-batches = 8): losses
// and gradient norms.
TEST(DistributedTrain, ResumesA3DZero3CheckpointAtPp4AndOnOneProcess) {
  const std::string full = fresh_dir("resume3d_full"), three_d = fresh_dir("resume3d_8"),
                    pp4 = fresh_dir("resume3d_pp4"), single = fresh_dir("resume3d_one");
  const std::string model = settings(2, 6) + " --set model.n_layer=4";  // four blocks: four stages at pp 4
  auto uninterrupted = run_tessera("train --config tiny_gpt" + model + " --set train.grad_accum=4 --out " + full);
  ASSERT_EQ(uninterrupted.exit_code, 0) << uninterrupted.output;
  auto first = run_tessera("train --config tiny_gpt --nproc 8 --set parallel.tp=2 --set parallel.pp=2 --set parallel.dp=2"
                           " --set parallel.zero_stage=3" + model + " --set train.grad_accum=2"
                           " --set checkpoint.every=3 --set checkpoint.keep=0 --out " + three_d);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  auto on_pp4 = run_tessera("train --resume " + three_d + "/checkpoints/step_3 --nproc 4 --set parallel.tp=1"
                            " --set parallel.dp=1 --set parallel.pp=4 --set parallel.zero_stage=0"
                            " --set train.grad_accum=4 --out " + pp4);
  ASSERT_EQ(on_pp4.exit_code, 0) << on_pp4.output;
  auto on_one = run_tessera("train --resume " + three_d + "/checkpoints/step_3 --set parallel.tp=1 --set parallel.pp=1"
                            " --set parallel.dp=0 --set parallel.zero_stage=0 --set train.grad_accum=4 --out " + single);
  ASSERT_EQ(on_one.exit_code, 0) << on_one.output;
  expect_same_losses(losses(three_d), losses(full), 1e-4, "tp2 x pp2 x dp2 ZeRO-3");
  for (const auto& [run, what] : {std::pair{pp4, "resumed at pp 4"}, std::pair{single, "resumed on one process"}}) {
    EXPECT_EQ(losses(run).begin()->first, 4) << what;
    expect_same_losses(losses(run), losses(full), 1e-4, what);
    expect_same_losses(grad_norms(run), grad_norms(full), 1e-4, std::string(what) + ", gradient norms");
  }
}

// Dropout under dp 2 x tp 2: every rank saves its own random streams (core/random_streams.h), so a
// run resumed on the same layout draws the masks the uninterrupted run drew: the same losses and
// gradient norms, bitwise. (Restoring one state on every rank, or none, changes the masks.)
TEST(DistributedTrain, DropoutRunResumesExactlyWithEachRanksStreams) {
  const std::string full = fresh_dir("dropout_full"), again = fresh_dir("dropout_again");
  const std::string set = tiny_settings(prepared_corpus()) +
                          " --set model.dropout=0.1 --set train.batch_size=2 --set train.steps=8 --set eval.every=0"
                          " --set parallel.tp=2 --set checkpoint.every=4 --set checkpoint.keep=0";
  auto first = run_tessera("train --config tiny_gpt --nproc 4" + set + " --out " + full);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  EXPECT_NE(first.output.find("dp=2 tp=2"), std::string::npos) << first.output;
  auto resumed = run_tessera("train --resume " + full + "/checkpoints/step_4 --nproc 4 --out " + again);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_EQ(resumed.output.find("re-seeded"), std::string::npos) << resumed.output;
  const auto expected_losses = losses(full), expected_norms = grad_norms(full);
  ASSERT_EQ(losses(again).size(), 4u);
  for (const auto& [step, loss] : losses(again)) {
    EXPECT_EQ(loss, expected_losses.at(step)) << "step " << step;
    EXPECT_EQ(grad_norms(again).at(step), expected_norms.at(step)) << "step " << step;
  }
}

// Error-feedback residuals differ between ranks: each rank saves its own, so a compressed run
// resumed on the same ranks continues exactly, and on another number of ranks each takes the mean.
TEST(DistributedTrain, CompressedRunResumesWithItsResiduals) {
  const std::string full = fresh_dir("psgd_full"), again = fresh_dir("psgd_again"), four = fresh_dir("psgd_four");
  const std::string powersgd = " --set parallel.grad_compression=powersgd --set parallel.powersgd_rank=2"
                               " --set parallel.powersgd_start_step=1";
  auto first = run_tessera("train --config tiny_gpt --nproc 2" + settings(4, 8) + powersgd +
                           " --set checkpoint.every=4 --set checkpoint.keep=0 --out " + full);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const std::string step4 = full + "/checkpoints/step_4";
  EXPECT_TRUE(fs::exists(step4 + "/compression-0-of-2.safetensors") &&
              fs::exists(step4 + "/compression-1-of-2.safetensors"));
  EXPECT_FALSE(read_safetensors(step4 + "/compression-1-of-2.safetensors").tensors.empty());

  auto resumed = run_tessera("train --resume " + step4 + " --nproc 2 --out " + again);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_EQ(resumed.output.find("compressor starts afresh"), std::string::npos) << resumed.output;
  const auto expected = losses(full), continued = losses(again);
  ASSERT_EQ(continued.begin()->first, 5);
  for (const auto& [step, loss] : continued) EXPECT_DOUBLE_EQ(loss, expected.at(step)) << "step " << step;

  auto on_four = run_tessera("train --resume " + step4 + " --nproc 4 --set train.batch_size=2 --out " + four);
  ASSERT_EQ(on_four.exit_code, 0) << on_four.output;
  EXPECT_NE(on_four.output.find("state of 2 ranks merged for 4 ranks"), std::string::npos) << on_four.output;
  // Ranks 2 and 3 find no random stream states in a 2-rank checkpoint: they re-seed from train.seed
  // and the step, and say so in their logs; ranks 0 and 1 restore theirs.
  for (int r = 0; r < 4; ++r) {
    const std::string log = slurp(four + "/logs/rank_" + std::to_string(r) + ".log");
    EXPECT_EQ(log.find("holds no random stream states for rank " + std::to_string(r) +
                       " (written by fewer ranks, or on another device type); dropout streams re-seeded from "
                       "train.seed and step 4") != std::string::npos,
              r >= 2)
        << "rank " << r << ":\n" << log;
  }
  expect_same_losses(losses(four), expected, 2e-2, "powersgd 2 ranks -> 4 ranks");

  // Top-k past its dense start: the residuals and the per-bucket step counts carry over.
  const std::string topk_full = fresh_dir("topk_full"), topk_again = fresh_dir("topk_again");
  const std::string topk = " --set parallel.grad_compression=topk --set parallel.topk_ratio=0.1"
                           " --set parallel.topk_start_step=2";
  auto topk_first = run_tessera("train --config tiny_gpt --nproc 2" + settings(4, 8) + topk +
                                " --set checkpoint.every=4 --set checkpoint.keep=0 --out " + topk_full);
  ASSERT_EQ(topk_first.exit_code, 0) << topk_first.output;
  auto topk_resumed = run_tessera("train --resume " + topk_full + "/checkpoints/step_4 --nproc 2 --out " + topk_again);
  ASSERT_EQ(topk_resumed.exit_code, 0) << topk_resumed.output;
  const auto topk_expected = losses(topk_full), topk_continued = losses(topk_again);
  ASSERT_EQ(topk_continued.begin()->first, 5);
  for (const auto& [step, loss] : topk_continued) EXPECT_DOUBLE_EQ(loss, topk_expected.at(step)) << "top-k step " << step;
}

// Processes started by torchrun, mpirun (Open MPI) or srun (Slurm) join one world from their
// launcher's environment (comm/rendezvous.h). Each style starts 2 ranks as 2 nodes of one process
// (local rank 0 of 1 each, as on two hosts), and each trains as 2 data-parallel ranks: one
// process's losses with the same global batch.
TEST(DistributedTrain, TorchrunMpirunAndSrunEnvironmentsFormOneWorld) {
  const std::string one = fresh_dir("launcher_env_one");
  ASSERT_EQ(run_tessera("train --config tiny_gpt" + settings(8, 3) + " --out " + one).exit_code, 0);
  const std::map<std::string, std::string> styles = {
      {"torchrun", "RANK={r} WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1"},
      {"mpirun", "OMPI_COMM_WORLD_RANK={r} OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_LOCAL_RANK=0 OMPI_COMM_WORLD_LOCAL_SIZE=1"},
      {"srun", "SLURM_PROCID={r} SLURM_NTASKS=2 SLURM_LOCALID=0 SLURM_NTASKS_PER_NODE=1"}};
  for (const auto& [launcher, pattern] : styles) {
    const std::string out = fresh_dir("launcher_env_" + launcher);
    const int port = store_port();
    std::vector<std::thread> ranks;
    std::vector<CommandResult> results(2);
    for (int r = 0; r < 2; ++r)
      ranks.emplace_back([&, r] {
        const std::string env = std::regex_replace(pattern, std::regex("\\{r\\}"), std::to_string(r)) +
                                " MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(port);
        results[r] = run_tessera_env(env, "train --config tiny_gpt" + settings(4, 3) + " --out " + out);
      });
    for (auto& t : ranks) t.join();
    for (int r = 0; r < 2; ++r) ASSERT_EQ(results[r].exit_code, 0) << launcher << " rank " << r << ": " << results[r].output;
    EXPECT_NE(results[0].output.find("dp=2 tp=1 pp=1 sp=1 ep=1 (world 2)"), std::string::npos) << results[0].output;
    expect_same_losses(losses(out), losses(one), 1e-4, launcher);
    expect_same_losses(grad_norms(out), grad_norms(one), 1e-4, launcher + ": gradient norm");
  }
}

// `tessera <command> --out out` run to its end, with `signal` sent to rank `rank`'s worker once
// its log shows step 2 (the run must be long enough to get there).
struct SignalledRun {
  CommandResult result;
  pid_t victim = -1;
  double seconds = 0;  // launch to end
};
SignalledRun run_and_signal(const std::string& command, const std::string& out, int rank, int signal) {
  SignalledRun run;
  const auto start = std::chrono::steady_clock::now();
  std::thread launcher([&] { run.result = run_tessera(command + " --out " + out); });
  const std::string log = out + "/logs/rank_" + std::to_string(rank) + ".log";
  for (int i = 0; i < 600 && run.victim < 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (slurp(log).find("step 2/") != std::string::npos) run.victim = find_worker(out, rank);
  }
  if (run.victim < 0) {
    std::fprintf(stderr, "rank %d never started training (%s)\n", rank, log.c_str());
    std::abort();  // the launcher would train for ever
  }
  ::kill(run.victim, signal);
  launcher.join();
  run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return run;
}

TEST(DistributedTrain, KilledRankStopsEveryWorkerAndNamesIt) {
  const std::string out = fresh_dir("kill_rank");
  const SignalledRun run = run_and_signal("train --config tiny_gpt --nproc 3" + settings(2, 100000) +
                                          " --set parallel.timeout_s=20", out, 1, SIGKILL);
  const CommandResult& result = run.result;
  const pid_t victim = run.victim;
  const double seconds = run.seconds;
  EXPECT_NE(result.exit_code, 0);
  EXPECT_NE(result.output.find("error: rank 1 (pid " + std::to_string(victim) + ") killed by signal 9"),
            std::string::npos)
      << result.output;
  EXPECT_LT(seconds, 90) << result.output;
  EXPECT_EQ(find_worker(out, 0), -1) << "rank 0 still running";
  EXPECT_EQ(find_worker(out, 2), -1) << "rank 2 still running";
  // Survivors whose collective failed on the closed connection wrote flight records (one the
  // launcher stopped first, under load, may not have); the killed rank wrote none, and the doctor
  // names it among the silent ranks.
  expect_doctor_names_silent_rank(out, 1);
}

// parallel.max_restarts: the run of a killed worker continues on the two that are left, from the
// last checkpoint, with the same global batch (two micro-batches per step become three), and the
// restart is in metrics.jsonl.
TEST(DistributedTrain, AKilledWorkersRunRestartsOnTheSurvivors) {
  const std::string out = fresh_dir("restart");
  const SignalledRun run = run_and_signal("train --config tiny_gpt --nproc 3" + settings(2, 40) +
                                              " --set train.global_batch_size=12 --set checkpoint.every=1"
                                              " --set parallel.max_restarts=1 --set parallel.timeout_s=20",
                                          out, 1, SIGKILL);
  const CommandResult& result = run.result;
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("tessera: restart 1 of 1: rank 1 (pid " + std::to_string(run.victim) +
                               ") killed by signal 9 (SIGKILL); continuing from checkpoint step "),
            std::string::npos)
      << result.output;
  EXPECT_NE(result.output.find("on 2 workers (parallel.dp 2)"), std::string::npos) << result.output;
  int restarts = 0;
  int64_t restarted_at = -1, last = 0;
  std::map<int64_t, int> logged;  // step -> loss lines
  for (const auto& line : metrics_lines(out)) {
    if (line.contains("restart")) {
      ++restarts;
      restarted_at = line["step"];
      EXPECT_EQ(line["world"], 2);
    } else if (line.contains("loss")) {
      ++logged[line["step"].get<int64_t>()];
      last = std::max<int64_t>(last, line["step"]);
      EXPECT_TRUE(std::isfinite(line["loss"].get<double>()));
    }
  }
  EXPECT_EQ(restarts, 1);
  EXPECT_GE(restarted_at, 1);  // a checkpoint every step: step 1's exists once rank 1 logs step 2
  EXPECT_EQ(last, 40);
  for (const auto& [step, count] : logged) EXPECT_EQ(count, 1) << "step " << step << " logged " << count << " times";
  EXPECT_EQ(slurp(out + "/checkpoints/latest").substr(0, 7), "step_40");
}

// parallel.max_restarts across nodes: two launchers of two workers each on this machine. A killed
// worker of node 1 (rank 3) stops both nodes' workers, and the run continues on 3 (node 1 runs one
// fewer); then node 1's launcher is killed with its worker (a lost host), and node 0's launcher,
// after waiting parallel.timeout_s for it, continues on its own 2 workers; then node 1's launcher is
// started again (the host is back): node 0 stops its workers with a checkpoint and the run goes on
// with both nodes' 4 workers. The global batch stays the same (12 sequences), every step is logged
// once, the three restarts are in metrics.jsonl.
TEST(DistributedTrain, ARunAcrossNodesRestartsOnWhatIsLeftAndGrowsWhenANodeComesBack) {
  const std::string out = fresh_dir("restart_nodes");
  const int port = store_port();
  const auto launch = [&](int node, const std::string& log) {
    return spawn_tessera("train --config tiny_gpt --nproc 2 --nnodes 2 --node-rank " + std::to_string(node) +
                             " --master 127.0.0.1:" + std::to_string(port) + settings(1, 60) +
                             " --set train.global_batch_size=12 --set checkpoint.every=1"
                             " --set parallel.max_restarts=2 --set parallel.timeout_s=10 --out " + out,
                         out + "_" + log + ".out");
  };
  const auto output = [&](const std::string& log) { return slurp(out + "_" + log + ".out"); };
  const auto last_logged = [&] {
    int64_t last = 0;
    for (const auto& line : metrics_lines(out))
      if (line.contains("loss")) last = std::max<int64_t>(last, line["step"]);
    return last;
  };
  const auto trains_on = [&](int64_t steps) {  // waits until the run logged `steps` more steps
    const int64_t from = last_logged();
    return wait_until([&] { return last_logged() >= from + steps; }, 120);
  };
  std::vector<pid_t> launchers = {launch(0, "node0"), launch(1, "node1")};
  pid_t victim = -1;
  ASSERT_TRUE(wait_until([&] { return last_logged() >= 2 && (victim = find_worker(out, 3)) > 0; }, 120))
      << output("node0") << output("node1");
  ::kill(victim, SIGKILL);
  ASSERT_TRUE(wait_until([&] { return output("node1").find("restart 1 of 2") != std::string::npos; }, 60))
      << output("node0") << output("node1");
  ASSERT_TRUE(trains_on(2)) << output("node0");
  ::kill(launchers[1], SIGKILL);  // node 1's host is gone: its worker dies with its launcher
  ASSERT_TRUE(wait_until([&] { return output("node0").find("restart 2 of 2") != std::string::npos; }, 60))
      << output("node0");
  ASSERT_TRUE(trains_on(2)) << output("node0");
  launchers[1] = launch(1, "node1_back");  // the host is back

  SuperviseOptions options;
  options.deadline_s = 180;
  options.stop_on_failure = false;  // the first node 1 launcher was killed; the others go on
  const SuperviseResult result = supervise(launchers, options);
  EXPECT_FALSE(result.timed_out);
  const std::string zero = output("node0"), back = output("node1_back");
  EXPECT_EQ(result.exits[0].code, 0) << zero;
  EXPECT_EQ(result.exits[1].code, 0) << back;
  EXPECT_NE(zero.find("tessera: restart 1 of 2: rank 3 (pid " + std::to_string(victim) +
                      ") on node 1 killed by signal 9 (SIGKILL); continuing from checkpoint step "),
            std::string::npos)
      << zero;
  EXPECT_NE(zero.find("on 3 workers (parallel.dp 3): node 0 2 workers, node 1 1 worker"), std::string::npos) << zero;
  EXPECT_NE(output("node1").find("on 3 workers (parallel.dp 3): node 0 2 workers, node 1 1 worker"), std::string::npos)
      << output("node1");
  EXPECT_NE(zero.find("on 2 workers (parallel.dp 2): node 0 2 workers; node 1's launcher did not rejoin within "
                      "parallel.timeout_s"),
            std::string::npos)
      << zero;
  EXPECT_NE(back.find("tessera: node 1 rejoins the run (generation 2)"), std::string::npos) << back;
  for (const std::string& text : {zero, back})
    EXPECT_NE(text.find("node 1's launcher rejoined; continuing from checkpoint step "), std::string::npos) << text;
  EXPECT_NE(zero.find("on 4 workers (parallel.dp 4): node 0 2 workers, node 1 2 workers"), std::string::npos) << zero;
  std::vector<int64_t> worlds;
  std::map<int64_t, int> logged;  // step -> loss lines
  for (const auto& line : metrics_lines(out)) {
    if (line.contains("restart")) worlds.push_back(line["world"]);
    if (line.contains("rejoined")) {
      EXPECT_EQ(line["rejoined"], 1);
    }
    if (line.contains("loss")) ++logged[line["step"].get<int64_t>()];
  }
  EXPECT_EQ(worlds, (std::vector<int64_t>{3, 2, 4}));
  ASSERT_FALSE(logged.empty());
  EXPECT_EQ(logged.rbegin()->first, 60);
  EXPECT_EQ(logged.size(), 60u);
  for (const auto& [step, count] : logged) EXPECT_EQ(count, 1) << "step " << step << " logged " << count << " times";
}

// A pipeline stage that stalls mid-schedule (SIGSTOP: alive, silent): the stages waiting on it end
// within parallel.timeout_s with an error naming the stalled rank and the action they waited on,
// and the launcher stops every worker.
TEST(DistributedTrain, AStalledPipelineStageIsNamedByTheOthers) {
  const std::string out = fresh_dir("stall_stage");
  const SignalledRun run = run_and_signal("train --config tiny_gpt --nproc 3" + settings(2, 100000) +
                                              " --set parallel.pp=3 --set model.n_layer=3 --set train.grad_accum=3"
                                              " --set parallel.timeout_s=10",
                                          out, 1, SIGSTOP);
  const CommandResult& result = run.result;
  const double seconds = run.seconds;
  EXPECT_NE(result.exit_code, 0);
  // Rank 0 prints to the launcher's output, the others to their logs.
  const std::string said = result.output + slurp(out + "/logs/rank_2.log");
  // Where rank 1 stops decides what the others were doing: waiting on its activations or gradients
  // (an action of the schedule, named with the rank it waits on), or in a collective at the step's
  // end (the clipping norm's all-reduce in OPTIM, the step's loss sums from the last stage, the
  // trainer's stop flag between steps, or, at step 3, the all-gather of the stages' timelines that
  // checks the start-up prediction: rank 1 is stopped once it logs step 2). In every case the error
  // says which rank went silent.
  const bool in_schedule = said.find("pipeline rank 0 (1f1b), action ") != std::string::npos &&
                           said.find("waiting on pipeline rank 1 (stage 1)") != std::string::npos;
  // (Gloo words a timeout as "Operation timed out" or, waiting on a receive, "Timed out waiting".)
  const std::regex collective_timeout(
      "(all_reduce|all_gather) of [0-9]+ bytes failed: (Operation timed out|.*Timed out waiting)");
  const bool in_collective = std::regex_search(said, collective_timeout);
  EXPECT_TRUE(in_schedule || in_collective) << said;
  EXPECT_NE(said.find("rank 1 sent no heartbeat"), std::string::npos) << said;
  EXPECT_LT(seconds, 90) << result.output;
  for (int r = 0; r < 3; ++r) EXPECT_EQ(find_worker(out, r), -1) << "rank " << r << " still running";
  // The ranks that timed out wrote their flight records; the stalled one could not, and the doctor
  // names it as the rank the others waited for.
  expect_doctor_names_silent_rank(out, 1);
}

// The launcher killed outright (SIGKILL: no chance to stop its workers) takes its workers with it
// (core/subprocess.h), so they hold neither the devices nor the run directory's lock.
TEST(DistributedTrain, WorkersDieWithAKilledLauncher) {
  const std::string out = fresh_dir("kill_launcher"), log = out + ".launcher.log";
  const pid_t launcher = spawn_tessera("train --config tiny_gpt --nproc 2 --out " + out + settings(2, 100000), log);
  ASSERT_TRUE(wait_until([&] { return slurp(out + "/logs/rank_1.log").find("step 2/") != std::string::npos; }, 60))
      << slurp(log);
  ASSERT_GT(find_worker(out, 0), 0);
  ASSERT_GT(find_worker(out, 1), 0);
  ::kill(launcher, SIGKILL);
  ::waitpid(launcher, nullptr, 0);
  bool gone = false;
  for (int i = 0; i < 100 && !gone; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    gone = find_worker(out, 0) < 0 && find_worker(out, 1) < 0;
  }
  EXPECT_TRUE(gone) << "workers still running 10 s after their launcher was killed";
}

// Preemption: SIGTERM to the launcher of a 2-rank run mid-training. Every rank finishes its step,
// one checkpoint of that step is written, the job exits with kStoppedExitCode (3) within
// parallel.timeout_s, and resuming it continues the uninterrupted run exactly (the same losses and
// gradient norms, bitwise).
TEST(DistributedTrain, SigtermToTheLauncherCheckpointsAndTheRunContinuesExactly) {
  const std::string full = fresh_dir("preempt_full"), out = fresh_dir("preempt");
  const std::string run = "train --config tiny_gpt --nproc 2" + settings(2, 60) +
                          " --set checkpoint.every=1000 --set parallel.timeout_s=30 --out ";
  ASSERT_EQ(run_tessera(run + full).exit_code, 0);
  const std::string log = out + ".launcher.log";
  const pid_t launcher = spawn_tessera(run + out, log);
  ASSERT_TRUE(wait_until([&] { return slurp(out + "/logs/rank_1.log").find("step 3/") != std::string::npos; }, 30))
      << slurp(log);
  const auto signalled = std::chrono::steady_clock::now();
  ::kill(launcher, SIGTERM);
  SuperviseOptions options;
  options.deadline_s = 60;
  options.ok_codes = {kStoppedExitCode};
  const SuperviseResult result = supervise({launcher}, options);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - signalled).count();
  const std::string output = slurp(log);
  ASSERT_EQ(result.exits[0].code, kStoppedExitCode) << output;
  EXPECT_LT(seconds, 30) << output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(output, m, std::regex("stopped at step ([0-9]+) of 60 \\(SIGTERM received\\)")))
      << output;
  const int step = std::stoi(m[1]);
  EXPECT_LT(step, 60);
  EXPECT_TRUE(fs::exists(out + "/checkpoints/step_" + std::to_string(step) + "/meta.json")) << output;
  auto resumed = run_tessera("train --resume " + out + " --nproc 2");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  const auto expected_loss = losses(full), expected_norm = grad_norms(full);
  const auto loss = losses(out), norm = grad_norms(out);
  ASSERT_EQ(loss.size(), 60u);
  for (const auto& [s, value] : loss) EXPECT_EQ(value, expected_loss.at(s)) << "step " << s;
  for (const auto& [s, value] : norm) EXPECT_EQ(value, expected_norm.at(s)) << "step " << s;
}

// train.time_limit: one process checkpoints and stops with exit code 3 once the wall time passes.
TEST(DistributedTrain, TimeLimitCheckpointsAndStops) {
  const std::string out = fresh_dir("time_limit");
  auto r = run_tessera("train --config tiny_gpt" + settings(2, 100000) + " --set train.time_limit=2 --out " + out);
  EXPECT_EQ(r.exit_code, kStoppedExitCode) << r.output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.output, m, std::regex("stopped at step ([0-9]+) of 100000 \\(train.time_limit = 2 s "
                                                        "reached\\)")))
      << r.output;
  EXPECT_TRUE(fs::exists(out + "/checkpoints/step_" + std::string(m[1]) + "/meta.json"));
}

TEST(DistributedTrain, DegreesThatDoNotFitAreRefusedBeforeLaunch) {
  const std::string out = fresh_dir("bad_degrees");
  auto r = run_tessera("train --config tiny_gpt --nproc 2 --set parallel.tp=3" + settings(4, 2) + " --out " + out);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("parallel.tp * parallel.pp * parallel.sp = 3 * 1 * 1 = 3 does not divide the world size 2"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("started ranks"), std::string::npos) << "workers were started: " << r.output;
  auto unbuilt = run_tessera("train --config tiny_gpt --nproc 4 --set parallel.pp=2 --set parallel.grad_compression=bf16" +
                             settings(4, 2) + " --out " + out);
  EXPECT_EQ(unbuilt.exit_code, 2);
  EXPECT_NE(unbuilt.output.find("parallel.pp > 1 with parallel.grad_compression = bf16: not implemented yet"),
            std::string::npos)
      << unbuilt.output;
  auto tp_heads = run_tessera("train --config tiny_gpt --nproc 4 --set parallel.tp=4" + settings(4, 2) + " --out " + out);
  EXPECT_EQ(tp_heads.exit_code, 2);
  EXPECT_NE(tp_heads.output.find("model.n_head = 2 is not a multiple of parallel.tp = 4"), std::string::npos)
      << tp_heads.output;
  EXPECT_EQ(unbuilt.output.find("started ranks"), std::string::npos) << "workers were started: " << unbuilt.output;
  // The backend must fit the device (and the build) before any worker starts.
  auto nccl_cpu = run_tessera("train --config tiny_gpt --nproc 2 --set parallel.backend=nccl" + settings(4, 2) +
                              " --out " + out);
  EXPECT_EQ(nccl_cpu.exit_code, 2);
  EXPECT_NE(nccl_cpu.output.find("parallel.backend = \"nccl\" needs train.device = cuda"), std::string::npos)
      << nccl_cpu.output;
  EXPECT_EQ(nccl_cpu.output.find("started ranks"), std::string::npos) << "workers were started: " << nccl_cpu.output;
  // Sequence parallelism: the method must fit the attention, Ulysses whole heads, chunks equal.
  auto lasp_gpt = run_tessera("train --config tiny_gpt --nproc 2 --set parallel.sp=2 --set parallel.sp_method=lasp" +
                              settings(4, 2) + " --out " + out);
  EXPECT_EQ(lasp_gpt.exit_code, 2);
  EXPECT_NE(lasp_gpt.output.find("parallel.sp_method = \"lasp\" with model.arch = gpt"), std::string::npos)
      << lasp_gpt.output;
  auto heads = run_tessera("train --config tiny_gpt --nproc 4 --set parallel.sp=4 --set parallel.sp_method=ulysses" +
                           settings(4, 2) + " --out " + out);
  EXPECT_EQ(heads.exit_code, 2);
  EXPECT_NE(heads.output.find("model.n_head = 2 is not a multiple of parallel.sp * parallel.tp = 4"), std::string::npos)
      << heads.output;
  auto uneven = run_tessera("train --config tiny_linear --nproc 3 --set parallel.sp=3" + settings(4, 2) + " --out " + out);
  EXPECT_EQ(uneven.exit_code, 2);
  EXPECT_NE(uneven.output.find("train.seq_len = 32 is not divisible by parallel.sp = 3"), std::string::npos)
      << uneven.output;
  EXPECT_EQ(uneven.output.find("started ranks"), std::string::npos) << "workers were started: " << uneven.output;
}

// Megatron tensor parallelism inside training: tp = 2 (with and without Megatron sequence
// parallelism, GPT and linear attention) and dp 2 x tp 2 at ZeRO 1, 2 and 3 with offload give one
// process's losses and gradient norms. A tp = 2 checkpoint holds each rank's part of a split tensor
// (nothing gathered to save it) and resumes on one process and at tp = 4; one process's checkpoint
// resumes at dp 2 x tp 2 ZeRO-1 (each rank reading its ZeRO range of its part); the parts export
// to whole tensors.
TEST(DistributedTrain, TensorParallelMatchesOneProcessAndResumesAtAnyTp) {
  const std::string one = fresh_dir("tp_one"), tp2 = fresh_dir("tp_two"), msp = fresh_dir("tp_msp"),
                    mixed = fresh_dir("tp_dp2"), resumed = fresh_dir("tp_resumed"), lin_one = fresh_dir("tp_lin_one"),
                    lin_tp = fresh_dir("tp_lin_two"), zero2 = fresh_dir("tp_zero2"), zero3 = fresh_dir("tp_zero3"),
                    at_tp4 = fresh_dir("tp_at_tp4"), one_at_tp2 = fresh_dir("tp_one_at_tp2"),
                    exported = fresh_dir("tp_exported");
  auto r1 = run_tessera("train --config tiny_gpt" + settings(8, 6, 4) +
                        " --set checkpoint.every=3 --set checkpoint.keep=0 --out " + one);
  ASSERT_EQ(r1.exit_code, 0) << r1.output;
  auto r2 = run_tessera("train --config tiny_gpt --nproc 2 --set parallel.tp=2" + settings(8, 6, 4) +
                        " --set checkpoint.every=3 --set checkpoint.keep=0 --out " + tp2);
  ASSERT_EQ(r2.exit_code, 0) << r2.output;
  auto r3 = run_tessera("train --config tiny_gpt --nproc 2 --set parallel.tp=2 --set parallel.megatron_sp=true" +
                        settings(8, 6, 4) + " --out " + msp);
  ASSERT_EQ(r3.exit_code, 0) << r3.output;
  auto r4 = run_tessera("train --config tiny_gpt --nproc 4 --set parallel.tp=2 --set parallel.zero_stage=1" +
                        settings(4, 6, 4) + " --out " + mixed);
  ASSERT_EQ(r4.exit_code, 0) << r4.output;
  auto r5 = run_tessera("train --resume " + tp2 + "/checkpoints/step_3 --set parallel.tp=1 --out " + resumed);
  ASSERT_EQ(r5.exit_code, 0) << r5.output;
  const auto index = nlohmann::json::parse(read_file(tp2 + "/checkpoints/step_3/model.safetensors.index.json"));
  EXPECT_EQ(index["part_map"]["transformer.h.0.attn.c_attn.weight"].size(), 2u) << index.dump();
  EXPECT_FALSE(index["weight_map"].contains("transformer.h.0.attn.c_attn.weight")) << index.dump();
  auto r8 = run_tessera("train --resume " + tp2 + "/checkpoints/step_3 --nproc 4 --set parallel.tp=4 --out " + at_tp4);
  ASSERT_EQ(r8.exit_code, 0) << r8.output;
  auto r9 = run_tessera("train --resume " + one + "/checkpoints/step_3 --nproc 4 --set parallel.tp=2"
                        " --set parallel.zero_stage=1 --set train.batch_size=4 --out " + one_at_tp2);
  ASSERT_EQ(r9.exit_code, 0) << r9.output;
  auto e = run_tessera("export --checkpoint " + tp2 + "/checkpoints/step_3 --out " + exported + "/model.safetensors");
  ASSERT_EQ(e.exit_code, 0) << e.output;
  const auto whole = read_safetensors(exported + "/model.safetensors").tensors;
  EXPECT_EQ(whole.at("transformer.h.0.attn.c_attn.weight").sizes(), at::IntArrayRef({32, 96}));
  // The tensor-parallel clipping norm over ZeRO-2/3 shards and offloaded host gradients.
  auto r6 = run_tessera("train --config tiny_gpt --nproc 4 --set parallel.tp=2 --set parallel.zero_stage=2" +
                        settings(4, 6, 4) + " --out " + zero2);
  ASSERT_EQ(r6.exit_code, 0) << r6.output;
  auto r7 = run_tessera("train --config tiny_gpt --nproc 4 --set parallel.tp=2 --set parallel.zero_stage=3"
                        " --set parallel.offload=true --set parallel.megatron_sp=true" + settings(4, 6, 4) + " --out " + zero3);
  ASSERT_EQ(r7.exit_code, 0) << r7.output;
  const auto expected = losses(one), expected_norms = grad_norms(one);
  expect_same_losses(losses(tp2), expected, 1e-4, "tp=2");
  expect_same_losses(grad_norms(resumed), expected_norms, 1e-4, "tp=2 checkpoint resumed on one process: gradient norm");
  expect_same_losses(losses(msp), expected, 1e-4, "tp=2 with Megatron sequence parallelism");
  expect_same_losses(losses(mixed), expected, 1e-4, "dp=2 x tp=2, ZeRO-1");
  expect_same_losses(losses(zero2), expected, 1e-4, "dp=2 x tp=2, ZeRO-2");
  expect_same_losses(losses(zero3), expected, 1e-4, "dp=2 x tp=2 Megatron-SP, ZeRO-3 with offload");
  for (const auto& [run, what] : {std::pair{tp2, "tp=2"}, {msp, "tp=2 Megatron-SP"}, {mixed, "dp2 x tp2 ZeRO-1"},
                                  {zero2, "dp2 x tp2 ZeRO-2"}, {zero3, "dp2 x tp2 ZeRO-3 offload"}})
    expect_same_losses(grad_norms(run), expected_norms, 1e-4, std::string(what) + ": gradient norm");
  expect_same_losses(losses(resumed), expected, 1e-4, "tp=2 checkpoint resumed on one process");
  EXPECT_EQ(losses(resumed).begin()->first, 4);
  for (const auto& [run, what] : {std::pair{at_tp4, "tp=2 checkpoint resumed at tp=4"},
                                  {one_at_tp2, "one process's checkpoint resumed at dp2 x tp2 ZeRO-1"}}) {
    EXPECT_EQ(losses(run).begin()->first, 4) << what;
    expect_same_losses(losses(run), expected, 1e-4, what);
    expect_same_losses(grad_norms(run), expected_norms, 1e-4, std::string(what) + ": gradient norm");
  }

  auto l1 = run_tessera("train --config tiny_linear" + settings(8, 6, 4) + " --out " + lin_one);
  ASSERT_EQ(l1.exit_code, 0) << l1.output;
  auto l2 = run_tessera("train --config tiny_linear --nproc 2 --set parallel.tp=2 --set parallel.megatron_sp=true" +
                        settings(8, 6, 4) + " --out " + lin_tp);
  ASSERT_EQ(l2.exit_code, 0) << l2.output;
  expect_same_losses(losses(lin_tp), losses(lin_one), 1e-4, "linear attention tp=2, Megatron SP");
}

// One key/value head for four query heads at tp = 2: each rank holds the whole kv_proj (replicated,
// its gradient summed over the two ranks) and its two query heads. The run gives one process's
// losses and gradient norms; its checkpoint holds kv_proj once, whole, beside q_proj's two parts,
// and resumes on one process, as one process's checkpoint resumes at tp = 2; so does a dp 2 x tp 2
// run at ZeRO-1, whose optimizer state of kv_proj the first tp rank of each replica writes.
TEST(DistributedTrain, KeyValueHeadsReplicatedOverTpMatchOneProcessAndResumeAtAnyTp) {
  const std::string one = fresh_dir("kv_one"), tp2 = fresh_dir("kv_tp2"), resumed = fresh_dir("kv_resumed"),
                    one_at_tp2 = fresh_dir("kv_one_at_tp2"), zero1 = fresh_dir("kv_zero1"),
                    zero1_resumed = fresh_dir("kv_zero1_resumed");
  const std::string llama = "train --config tiny_llama --set model.n_kv_head=1 --set checkpoint.every=3"
                            " --set checkpoint.keep=0";
  auto r1 = run_tessera(llama + settings(8, 6, 4) + " --out " + one);
  ASSERT_EQ(r1.exit_code, 0) << r1.output;
  auto r2 = run_tessera(llama + settings(8, 6, 4) + " --nproc 2 --set parallel.tp=2 --out " + tp2);
  ASSERT_EQ(r2.exit_code, 0) << r2.output;
  auto r5 = run_tessera(llama + settings(4, 6, 4) + " --nproc 4 --set parallel.tp=2 --set parallel.zero_stage=1 --out " +
                        zero1);
  ASSERT_EQ(r5.exit_code, 0) << r5.output;
  auto r6 = run_tessera("train --resume " + zero1 + "/checkpoints/step_3 --set parallel.tp=1 --set parallel.zero_stage=0"
                        " --set train.batch_size=8 --out " + zero1_resumed);
  ASSERT_EQ(r6.exit_code, 0) << r6.output;
  const auto index = nlohmann::json::parse(read_file(tp2 + "/checkpoints/step_3/model.safetensors.index.json"));
  EXPECT_TRUE(index["weight_map"].contains("model.h.0.attn.kv_proj.weight")) << index.dump();
  EXPECT_EQ(index["part_map"]["model.h.0.attn.q_proj.weight"].size(), 2u) << index.dump();
  auto r3 = run_tessera("train --resume " + tp2 + "/checkpoints/step_3 --set parallel.tp=1 --out " + resumed);
  ASSERT_EQ(r3.exit_code, 0) << r3.output;
  auto r4 = run_tessera("train --resume " + one + "/checkpoints/step_3 --nproc 2 --set parallel.tp=2 --out " +
                        one_at_tp2);
  ASSERT_EQ(r4.exit_code, 0) << r4.output;
  const auto expected = losses(one), expected_norms = grad_norms(one);
  expect_same_losses(losses(tp2), expected, 1e-4, "kv heads replicated at tp=2");
  expect_same_losses(grad_norms(tp2), expected_norms, 1e-4, "kv heads replicated at tp=2: gradient norm");
  expect_same_losses(losses(zero1), expected, 1e-4, "kv heads replicated at dp=2 x tp=2, ZeRO-1");
  for (const auto& [run, what] : {std::pair{resumed, "tp=2 checkpoint resumed on one process"},
                                  {one_at_tp2, "one process's checkpoint resumed at tp=2"},
                                  {zero1_resumed, "dp=2 x tp=2 ZeRO-1 checkpoint resumed on one process"}}) {
    EXPECT_EQ(losses(run).begin()->first, 4) << what;
    expect_same_losses(losses(run), expected, 1e-4, what);
    expect_same_losses(grad_norms(run), expected_norms, 1e-4, std::string(what) + ": gradient norm");
  }
}

// Expert parallelism inside training, and its checkpoints at any ep: four experts, top-2, with
// aux-loss-free balancing, trained at ep = 4 (dp 4, ZeRO-1) give one process's losses, gradient
// norms and expert loads over the same micro-batches (batch 2, four per step); the ep = 4
// checkpoint holds each rank's experts as parts of the stacked tensors (nothing gathered) and the
// selection biases, and resumes at ep = 2 (dp 2, two micro-batches each, ZeRO-3) and on one
// process, optimizer state included, continuing the uninterrupted run.
TEST(DistributedTrain, ExpertParallelMatchesOneProcessAndResumesAtAnyEp) {
  const std::string one = fresh_dir("ep_one"), ep4 = fresh_dir("ep_four"), at_ep2 = fresh_dir("ep_at_two"),
                    at_one = fresh_dir("ep_at_one");
  // Aux-loss-free balancing on: the selection bias moves the routing each step, so a resume that
  // lost it (or a rank whose bias differed) would route differently.
  const std::string moe = " --set model.ffn=moe --set model.moe_experts=4 --set model.moe_top_k=2"
                          " --set model.moe_bias_update_rate=0.01";
  auto r1 = run_tessera("train --config tiny_gpt" + moe + settings(2, 6) + " --set train.grad_accum=4 --out " + one);
  ASSERT_EQ(r1.exit_code, 0) << r1.output;
  auto r2 = run_tessera("train --config tiny_gpt --nproc 4 --set parallel.ep=4 --set parallel.zero_stage=1" + moe +
                        settings(2, 6) + " --set checkpoint.every=3 --set checkpoint.keep=0 --out " + ep4);
  ASSERT_EQ(r2.exit_code, 0) << r2.output;
  const auto index = nlohmann::json::parse(read_file(ep4 + "/checkpoints/step_3/model.safetensors.index.json"));
  EXPECT_EQ(index["part_map"]["model.h.0.moe.w_fc"].size(), 4u) << index.dump();
  auto r3 = run_tessera("train --resume " + ep4 + "/checkpoints/step_3 --nproc 2 --set parallel.ep=2"
                        " --set parallel.zero_stage=3 --set train.grad_accum=2 --out " + at_ep2);
  ASSERT_EQ(r3.exit_code, 0) << r3.output;
  auto r4 = run_tessera("train --resume " + ep4 + "/checkpoints/step_3 --nproc 1 --set parallel.ep=1"
                        " --set parallel.zero_stage=0 --set train.grad_accum=4 --out " + at_one);
  ASSERT_EQ(r4.exit_code, 0) << r4.output;
  const auto expected = losses(one), expected_norms = grad_norms(one);
  // Per MoE layer and step, the loads over every rank equal one process's, and sum to the step's
  // tokens times top_k (4 micro-batches of 2 x seq_len tokens).
  std::map<int64_t, nlohmann::json> routed;
  for (const auto& line : metrics_lines(one))
    if (line.contains("moe")) routed[line["step"]] = line["moe"];
  ASSERT_EQ(routed.size(), 6u);
  for (const auto& line : metrics_lines(ep4)) {
    if (!line.contains("moe")) continue;
    const nlohmann::json& want = routed.at(line["step"]);
    ASSERT_EQ(line["moe"].size(), want.size());
    for (size_t l = 0; l < want.size(); ++l) {
      EXPECT_EQ(line["moe"][l]["load"], want[l]["load"]) << "step " << line["step"] << " layer " << l;
      double total = 0, most = 0;
      for (double v : want[l]["load"]) {
        total += v;
        most = std::max(most, v);
      }
      EXPECT_EQ(total, 2.0 * 4 * 2 * 32) << "step " << line["step"];  // k x micro-batches x rows x train.seq_len
      EXPECT_NEAR(line["moe"][l]["max_violation"].get<double>(), most / (total / 4) - 1, 1e-12);
    }
  }
  expect_same_losses(losses(ep4), expected, 1e-4, "ep=4");
  expect_same_losses(grad_norms(ep4), expected_norms, 1e-4, "ep=4: gradient norm");
  for (const auto& [run, what] : {std::pair{at_ep2, "ep=4 checkpoint resumed at ep=2, ZeRO-3"},
                                  {at_one, "ep=4 checkpoint resumed on one process"}}) {
    EXPECT_EQ(losses(run).begin()->first, 4) << what;
    expect_same_losses(losses(run), expected, 1e-4, what);
    expect_same_losses(grad_norms(run), expected_norms, 1e-4, std::string(what) + ": gradient norm");
  }
}

// --init-from loads the starting weights whatever the layout: each rank reads the tensors (or
// the shards of them) it keeps, so tp=2 and dp=2 under ZeRO-3 start where one process starts and
// train alike (losses and gradient norms).
TEST(DistributedTrain, InitFromStartsEveryLayoutFromTheSameWeights) {
  const std::string base = fresh_dir("init_base"), one = fresh_dir("init_one"), tp2 = fresh_dir("init_tp2"),
                    zero3 = fresh_dir("init_zero3");
  auto trained = run_tessera("train --config tiny_gpt" + settings(8, 10) + " --out " + base);
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  const std::string from = " --init-from " + base + " --set data.seed=7";
  auto r1 = run_tessera("train --config tiny_gpt" + settings(8, 4) + from + " --out " + one);
  ASSERT_EQ(r1.exit_code, 0) << r1.output;
  auto r2 = run_tessera("train --config tiny_gpt --nproc 2 --set parallel.tp=2" + settings(8, 4) + from + " --out " + tp2);
  ASSERT_EQ(r2.exit_code, 0) << r2.output;
  auto r3 = run_tessera("train --config tiny_gpt --nproc 2 --set parallel.zero_stage=3" + settings(4, 4) + from +
                        " --out " + zero3);
  ASSERT_EQ(r3.exit_code, 0) << r3.output;
  expect_same_losses(losses(tp2), losses(one), 1e-4, "init-from at tp=2");
  expect_same_losses(losses(zero3), losses(one), 1e-4, "init-from at dp=2 ZeRO-3");
  expect_same_losses(grad_norms(tp2), grad_norms(one), 1e-4, "init-from at tp=2: gradient norm");
  expect_same_losses(grad_norms(zero3), grad_norms(one), 1e-4, "init-from at dp=2 ZeRO-3: gradient norm");
  EXPECT_LT(losses(one).at(1), 0.9 * losses(base).at(1));
}

// Pipeline parallelism through `tessera train` trains the model of one process: 4 blocks cut into
// 2 or 4 stages, each built on its rank, the step's 4 micro-batches run by ZB-V, 1F1B or ZB-H1,
// the same losses, gradient norms and validation loss. A pp = 4 checkpoint (each rank writing its
// stage) resumes at pp = 2 and on one process and continues the same run.
TEST(DistributedTrain, PipelineSchedulesMatchOneProcessAndCheckpointsLoadAtAnyPp) {
  const std::string pipeline = " --set model.n_layer=4 --set train.grad_accum=4";
  const std::string one = fresh_dir("pp_one");
  auto r1 = run_tessera("train --config tiny_gpt" + settings(2, 6) + pipeline + " --out " + one);
  ASSERT_EQ(r1.exit_code, 0) << r1.output;
  const auto expected = losses(one), expected_norms = grad_norms(one), expected_val = logged(one, "val_loss");
  // Every schedule's gradients are the harness's (tests/equivalence: each at pp 2, most at pp 4);
  // here the command line's path: a V schedule's checkpoint, a pp 4 one resumed at pp 2 and on one
  // process, a traced step.
  for (const auto& [pp, schedule] : std::vector<std::pair<int, std::string>>{{2, "zbv"}, {4, "1f1b"}, {4, "zbh1"}}) {
    const std::string what = "pp=" + std::to_string(pp) + " " + schedule;
    const std::string out = fresh_dir("pp_" + std::to_string(pp) + "_" + schedule);
    auto r = run_tessera("train --config tiny_gpt --nproc " + std::to_string(pp) + " --set parallel.pp=" +
                         std::to_string(pp) + " --set parallel.pp_schedule=" + schedule + settings(2, 6) + pipeline +
                         " --set checkpoint.every=3 --set checkpoint.keep=0 --out " + out);
    ASSERT_EQ(r.exit_code, 0) << what << "\n" << r.output;
    // The start-up profile's prediction, and its check after step 3.
    EXPECT_NE(r.output.find("with each stage's measured F, I, W: predicted step"), std::string::npos) << what << r.output;
    EXPECT_NE(r.output.find("pipeline: step 3 ran its schedule in"), std::string::npos) << what << r.output;
    expect_same_losses(losses(out), expected, 1e-5, what);
    expect_same_losses(grad_norms(out), expected_norms, 1e-5, what + ": gradient norm");
    expect_same_losses(logged(out, "val_loss"), expected_val, 1e-5, what + ": validation loss");
    if (pp == 4 && schedule == "zbh1") {
      // train.trace_step: step 2's timeline of all 4 ranks, measured and planned.
      auto traced = run_tessera("train --config tiny_gpt --nproc 4 --set parallel.pp=4 --set parallel.pp_schedule=zbh1" +
                                settings(2, 2) + pipeline + " --set train.trace_step=2 --out " + out + "_traced");
      ASSERT_EQ(traced.exit_code, 0) << traced.output;
      EXPECT_NE(traced.output.find("pipeline timeline of step 2"), std::string::npos) << traced.output;
      const nlohmann::json trace = nlohmann::json::parse(slurp(out + "_traced/pipeline_step2.trace.json"));
      std::set<int> pids;
      int computes = 0;
      for (const auto& e : trace["traceEvents"]) {
        pids.insert(e["pid"].get<int>());
        if (e.value("cat", "") == "compute") ++computes;
      }
      EXPECT_EQ(pids.size(), 4u);
      EXPECT_EQ(computes, 4 * 4 * 3);  // 4 ranks x 4 micro-batches x F, I, W
      EXPECT_NE(slurp(out + "_traced/pipeline_step2.svg").find("zbh1, pp 4, 4 micro-batches, measured"), std::string::npos);
      EXPECT_NE(slurp(out + "_traced/pipeline_step2.planned.svg").find("planned with each stage's measured mean times"), std::string::npos);
    }
    if (schedule == "zbv") {
      // Two stages per rank, V-shaped: its checkpoint resumes on one process.
      const std::string resumed = fresh_dir("pp_zbv_resumed_one");
      auto one_more = run_tessera("train --resume " + out + "/checkpoints/step_3 --set parallel.pp=1 --out " + resumed);
      ASSERT_EQ(one_more.exit_code, 0) << one_more.output;
      expect_same_losses(losses(resumed), expected, 1e-5, "pp=2 zbv checkpoint resumed on one process");
    }
    if (pp != 4 || schedule != "1f1b") continue;
    // The pp = 4 checkpoint at step 3 continues at pp = 2 and on one process.
    const std::string at_two = fresh_dir("pp_resumed_two"), at_one = fresh_dir("pp_resumed_one");
    auto two = run_tessera("train --resume " + out + "/checkpoints/step_3 --nproc 2 --set parallel.pp=2 --out " + at_two);
    ASSERT_EQ(two.exit_code, 0) << two.output;
    auto single = run_tessera("train --resume " + out + "/checkpoints/step_3 --set parallel.pp=1 --out " + at_one);
    ASSERT_EQ(single.exit_code, 0) << single.output;
    expect_same_losses(losses(at_two), expected, 1e-5, "pp=4 checkpoint resumed at pp=2");
    expect_same_losses(losses(at_one), expected, 1e-5, "pp=4 checkpoint resumed on one process");
    expect_same_losses(grad_norms(at_two), expected_norms, 1e-5, "pp=4 checkpoint resumed at pp=2: gradient norm");
    expect_same_losses(grad_norms(at_one), expected_norms, 1e-5, "pp=4 checkpoint resumed on one process: gradient norm");
    EXPECT_EQ(losses(at_one).begin()->first, 4);
    auto exported = run_tessera("export --checkpoint " + out + " --out " + out + "/model.safetensors");
    ASSERT_EQ(exported.exit_code, 0) << exported.output;
    EXPECT_NE(exported.output.find(": 52 tensors"), std::string::npos) << exported.output;  // 4 blocks x 12 + 4
  }
  // dp = 2 x pp = 2 with ZeRO-3 (each dp rank half of every micro-batch's rows; each stage gathered
  // once per pass): the same run and validation loss, and its sharded checkpoint resumes in the
  // same layout (each rank reading its ZeRO ranges) and on one process.
  const std::string mixed = fresh_dir("pp_dp_zero3");
  const std::string dp_pp = " --nproc 4 --set parallel.dp=2 --set parallel.pp=2 --set parallel.zero_stage=3";
  auto rm = run_tessera("train --config tiny_gpt" + dp_pp + " --set parallel.pp_schedule=zbh1" + settings(1, 6) + pipeline +
                        " --set checkpoint.every=3 --set checkpoint.keep=0 --out " + mixed);
  ASSERT_EQ(rm.exit_code, 0) << rm.output;
  EXPECT_NE(rm.output.find("dp=2 tp=1 pp=2 sp=1 ep=1 (world 4)"), std::string::npos) << rm.output;
  expect_same_losses(losses(mixed), expected, 1e-5, "dp=2 x pp=2 ZeRO-3");
  expect_same_losses(grad_norms(mixed), expected_norms, 1e-5, "dp=2 x pp=2 ZeRO-3: gradient norm");
  expect_same_losses(logged(mixed, "val_loss"), expected_val, 1e-5, "dp=2 x pp=2 ZeRO-3: validation loss");
  const std::string mixed_again = fresh_dir("pp_dp_zero3_resumed"), mixed_one = fresh_dir("pp_dp_zero3_one");
  auto again = run_tessera("train --resume " + mixed + "/checkpoints/step_3" + dp_pp + " --out " + mixed_again);
  ASSERT_EQ(again.exit_code, 0) << again.output;
  expect_same_losses(losses(mixed_again), expected, 1e-5, "dp=2 x pp=2 ZeRO-3 checkpoint resumed in its layout");
  auto single = run_tessera("train --resume " + mixed + "/checkpoints/step_3 --set parallel.pp=1 --set parallel.dp=1"
                            " --set parallel.zero_stage=0 --set train.batch_size=2 --out " + mixed_one);
  ASSERT_EQ(single.exit_code, 0) << single.output;
  expect_same_losses(losses(mixed_one), expected, 1e-5, "dp=2 x pp=2 ZeRO-3 checkpoint resumed on one process");
  EXPECT_EQ(losses(mixed_one).begin()->first, 4);
  // pp = 2 x tp = 2 with Megatron sequence parallelism: the same run; its checkpoint (each tensor
  // gathered over tp by the rank of the stage that writes it) resumes at pp = 4 on 4 ranks.
  const std::string tp_pp = fresh_dir("pp_tp"), tp_pp_resumed = fresh_dir("pp_tp_resumed_pp4");
  auto rt = run_tessera("train --config tiny_gpt --nproc 4 --set parallel.pp=2 --set parallel.tp=2 "
                        "--set parallel.megatron_sp=true" + settings(2, 6) + pipeline +
                        " --set checkpoint.every=3 --set checkpoint.keep=0 --out " + tp_pp);
  ASSERT_EQ(rt.exit_code, 0) << rt.output;
  expect_same_losses(losses(tp_pp), expected, 1e-5, "pp=2 x tp=2 Megatron-SP");
  expect_same_losses(grad_norms(tp_pp), expected_norms, 1e-5, "pp=2 x tp=2 Megatron-SP: gradient norm");
  auto at_pp4 = run_tessera("train --resume " + tp_pp + "/checkpoints/step_3 --nproc 4 --set parallel.pp=4"
                            " --set parallel.tp=1 --set parallel.megatron_sp=false --out " + tp_pp_resumed);
  ASSERT_EQ(at_pp4.exit_code, 0) << at_pp4.output;
  expect_same_losses(losses(tp_pp_resumed), expected, 1e-5, "pp=2 x tp=2 checkpoint resumed at pp=4");
  expect_same_losses(grad_norms(tp_pp_resumed), expected_norms, 1e-5, "pp=2 x tp=2 checkpoint resumed at pp=4: gradient norm");
}

// ZeRO-Offload on a single process (its main use: one GPU) runs through DataParallel too, and
// trains exactly as without it.
TEST(DistributedTrain, OffloadOnOneProcessMatchesNoOffload) {
  const std::string plain = fresh_dir("offload_plain"), offload = fresh_dir("offload_one");
  auto r1 = run_tessera("train --config tiny_gpt" + settings(4, 5) + " --out " + plain);
  ASSERT_EQ(r1.exit_code, 0) << r1.output;
  auto r2 = run_tessera("train --config tiny_gpt --set parallel.offload=true --set parallel.zero_stage=1" +
                        settings(4, 5) + " --out " + offload);
  ASSERT_EQ(r2.exit_code, 0) << r2.output;
  expect_same_losses(losses(offload), losses(plain), 1e-6, "offload on one process");
  expect_same_losses(grad_norms(offload), grad_norms(plain), 1e-6, "offload on one process: gradient norm");
  auto refused = run_tessera("train --config tiny_gpt --set parallel.offload=true" + settings(4, 2) + " --out " + offload);
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_NE(refused.output.find("parallel.offload"), std::string::npos) << refused.output;
}

// LASP inside training: every rank of an sp group runs its chunk of the same sequences, gradients
// are reduced over dp x sp. Losses (training and validation) equal one process with the same batch.
TEST(DistributedTrain, LaspSequenceParallelMatchesOneProcess) {
  const std::string linear = " --set model.linear_chunk=4 --set eval.every=3";
  const std::string one = fresh_dir("lasp_one"), sp2 = fresh_dir("lasp_sp2"), sp4 = fresh_dir("lasp_sp4"),
                    mixed = fresh_dir("lasp_dp2_sp2");
  auto r1 = run_tessera("train --config tiny_linear" + settings(8, 6) + linear + " --out " + one);
  ASSERT_EQ(r1.exit_code, 0) << r1.output;
  auto r2 = run_tessera("train --config tiny_linear --nproc 2 --set parallel.sp=2" + settings(8, 6) + linear +
                        " --out " + sp2);
  ASSERT_EQ(r2.exit_code, 0) << r2.output;
  EXPECT_NE(r2.output.find("dp=1 tp=1 pp=1 sp=2 ep=1 (world 2)"), std::string::npos) << r2.output;
  auto r4 = run_tessera("train --config tiny_linear --nproc 4 --set parallel.sp=4 --set parallel.sp_method=lasp2"
                        " --set parallel.zero_stage=3" + settings(8, 6) + linear + " --out " + sp4);
  ASSERT_EQ(r4.exit_code, 0) << r4.output;
  auto rm = run_tessera("train --config tiny_linear --nproc 4 --set parallel.sp=2 --set parallel.zero_stage=2" +
                        settings(4, 6) + linear + " --out " + mixed);
  ASSERT_EQ(rm.exit_code, 0) << rm.output;
  const auto expected = losses(one);
  expect_same_losses(losses(sp2), expected, 1e-4, "LASP sp=2");
  expect_same_losses(losses(sp4), expected, 1e-4, "LASP-2 sp=4, ZeRO-3");
  expect_same_losses(losses(mixed), expected, 1e-4, "dp=2 x sp=2, ZeRO-2");
  for (const auto& [run, what] : {std::pair{sp2, "LASP sp=2"}, std::pair{sp4, "LASP-2 sp=4, ZeRO-3"},
                                  std::pair{mixed, "dp=2 x sp=2, ZeRO-2"}})
    expect_same_losses(grad_norms(run), grad_norms(one), 1e-4, std::string(what) + ": gradient norm");
  auto val_losses = [](const std::string& run) {
    std::map<int64_t, double> out;
    for (const auto& line : metrics_lines(run))
      if (line.contains("val_loss")) out[line["step"]] = line["val_loss"];
    return out;
  };
  ASSERT_EQ(val_losses(one).size(), 2u);
  expect_same_losses(val_losses(sp2), val_losses(one), 1e-5, "LASP sp=2 validation");
  expect_same_losses(val_losses(mixed), val_losses(one), 1e-5, "dp=2 x sp=2 validation");
}

}  // namespace
}  // namespace tessera::test
