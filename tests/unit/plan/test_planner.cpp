// The planner (`tessera plan`): cluster files and their refusals, the link tier a group crosses,
// the collective formulas, the operations each block kind declares against the model's own FLOP
// count, the cost model's step against its parts, and the search against brute force.
#include <gtest/gtest.h>


#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include "model/model_size.h"
#include "model/operations.h"
#include "model/transformer.h"
#include "parallel/layout_check.h"
#include "plan/cluster.h"
#include "plan/cost_model.h"
#include "plan/matmul_table.h"
#include "plan/search.h"
#include "plan_test_util.h"
#include "test_util.h"
#include "tiny_config.h"
#include "config/config.h"

namespace tessera {
namespace {

using plan::Cluster;

const char* const kCluster = test::kPlannerCluster;

Cluster test_cluster() { return plan::parse_cluster(kCluster, "test.toml"); }

TEST(ClusterFile, EveryPresetLoadsWithAchievableRatesBelowItsPeaks) {
  int presets = 0;
  for (const auto& entry : std::filesystem::directory_iterator(test::source_path("clusters"))) {
    if (entry.path().extension() != ".toml") continue;  // clusters/tables/ holds the files they name
    const Cluster c = plan::load_cluster(entry.path().string());
    EXPECT_FALSE(c.device.name.empty()) << entry.path();
    EXPECT_LE(c.device.matmul_tflops_bf16, c.device.peak_tflops_bf16) << entry.path();
    ++presets;
  }
  EXPECT_GE(presets, 4);
}

TEST(ClusterFile, BadFilesAreRefusedNamingTheFileAndTheKey) {
  EXPECT_TRUE(test::throws_naming(
      [] { plan::parse_cluster(test::replaced_text(kCluster, "peak_tflops_bf16", "peek_tflops_bf16"), "bad.toml"); },
      {"bad.toml", "unknown key 'device.peek_tflops_bf16'", "did you mean 'device.peak_tflops_bf16'"}));
  EXPECT_TRUE(test::throws_naming([] { plan::parse_cluster(test::replaced_text(kCluster, "memory_gbs = 1000", ""), "bad.toml"); },
                                  {"bad.toml", "device.memory_gbs is missing"}));
  EXPECT_TRUE(test::throws_naming(
      [] { plan::parse_cluster(test::replaced_text(kCluster, "bandwidth_gbs = 100", "bandwidth_gbs = -3"), "bad.toml"); },
      {"bad.toml", "intra_node.bandwidth_gbs", "outside its range"}));
  EXPECT_TRUE(test::throws_naming(
      [] { plan::parse_cluster(test::replaced_text(kCluster, "matmul_tflops_bf16 = 80", "matmul_tflops_bf16 = 120"), "bad.toml"); },
      {"bad.toml", "must not exceed"}));
  EXPECT_TRUE(test::throws_naming([] { plan::parse_cluster(std::string(kCluster) + "\n[devise]\n", "bad.toml"); },
                                  {"bad.toml", "unknown section '[devise]'", "did you mean '[device]'"}));
  EXPECT_TRUE(test::throws_naming([] { plan::load_cluster("no_such_cluster"); }, {"no_such_cluster", "no such cluster"}));
}

TEST(ClusterFile, AGroupIsPricedOnTheSlowestTierItCrosses) {
  const Cluster c = test_cluster();  // 4 devices per node
  const Cluster::Tier node = c.tier({0, 1, 2, 3});
  EXPECT_FALSE(node.crosses_nodes);
  EXPECT_DOUBLE_EQ(node.bandwidth_bytes_per_s, 100e9);
  const Cluster::Tier one_per_node = c.tier({0, 4, 8});
  EXPECT_TRUE(one_per_node.crosses_nodes);
  EXPECT_DOUBLE_EQ(one_per_node.bandwidth_bytes_per_s, 10e9);
  EXPECT_DOUBLE_EQ(one_per_node.latency_s, 20e-6);
  EXPECT_DOUBLE_EQ(c.tier({0, 1, 4, 5}).bandwidth_bytes_per_s, 20e9);     // two adapters per node at once
  EXPECT_DOUBLE_EQ(c.tier({0, 1, 2, 3, 4, 5, 6, 7}).bandwidth_bytes_per_s, 40e9);
}

// device.matmul_table: a grid of measured rates, exact at its points, interpolated in log2 between
// them, its edge's rate beyond; a bf16 product priced at its shape's rate (a table at the flat
// rate changes nothing, one at half of it doubles the products' time); refusals name the file.
TEST(ClusterFile, AMatmulTablePricesEachProductAtItsShape) {
  const std::string dir = test::fresh_dir("matmul_table");
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir + "/" + name) << text;
    return dir + "/" + name;
  };
  std::string grid = "# a test grid\nrows,cols,depth,tflops_bf16\n";
  for (int r : {256, 1024})
    for (int c : {256, 1024})
      for (int d : {256, 1024}) grid += std::to_string(r) + "," + std::to_string(c) + "," + std::to_string(d) + "," +
                                        std::to_string(r == 1024 ? 40 : 20) + "\n";
  const plan::MatmulTable table = plan::MatmulTable::parse(grid, "grid.csv");
  EXPECT_DOUBLE_EQ(table.tflops(256, 256, 256), 20);
  EXPECT_DOUBLE_EQ(table.tflops(1024, 256, 1024), 40);
  EXPECT_DOUBLE_EQ(table.tflops(512, 300, 700), 30);     // rows halfway in log2
  EXPECT_DOUBLE_EQ(table.tflops(1 << 20, 1, 1 << 20), 40);  // beyond the grid: its edge
  EXPECT_TRUE(test::throws_naming([&] { plan::MatmulTable::parse(grid.substr(0, grid.rfind("1024,1024,1024")), "cut.csv"); },
                                  {"cut.csv", "no point 1024 x 1024 x 1024"}));
  EXPECT_TRUE(test::throws_naming([] { plan::MatmulTable::parse("rows,cols,depth,tflops_bf16\n1,2,x,4\n", "bad.csv"); },
                                  {"bad.csv:2", "'x' is not a number"}));
  EXPECT_TRUE(test::throws_naming([] { plan::MatmulTable::parse("m,n,k,rate\n", "head.csv"); },
                                  {"head.csv:1", "rows,cols,depth,tflops_bf16"}));
  EXPECT_TRUE(test::throws_naming(
      [&] { plan::load_cluster(write("missing.toml", test::replaced_text(kCluster, "memory_gbs = 1000", "memory_gbs = 1000\nmatmul_table = \"none.csv\""))); },
      {"missing.toml", "device.matmul_table", "none.csv", "no such file"}));

  // Pricing: a flat table at matmul_tflops_bf16 changes nothing; at half of it, the products take
  // twice as long (no kernel overheads in this cluster).
  auto flat = [&](double tflops) {
    std::string text = "rows,cols,depth,tflops_bf16\n";
    for (int r : {256, 4096})
      for (int c : {256, 4096})
        for (int d : {256, 4096})
          text += std::to_string(r) + "," + std::to_string(c) + "," + std::to_string(d) + "," + std::to_string(tflops) + "\n";
    return text;
  };
  write("flat.csv", flat(80));
  write("half.csv", flat(40));
  const std::string with = "memory_gbs = 1000\nmatmul_table = \"";
  const Cluster none = test_cluster();
  const Cluster same = plan::load_cluster(write("same.toml", test::replaced_text(kCluster, "memory_gbs = 1000", with + "flat.csv\"")));
  const Cluster half = plan::load_cluster(write("half.toml", test::replaced_text(kCluster, "memory_gbs = 1000", with + "half.csv\"")));
  Config c = test::tiny_config(64);
  c.model = ModelOptions::from_preset("gpt2_124m");  // products deep enough to be compute-bound
  c.train.seq_len = 1024;
  c.train.batch_size = 8;
  c.precision.dtype = "bf16";
  const ParallelDims one(c.parallel, 1, "test");
  auto products = [&](const Cluster& cluster) {
    for (const auto& [name, seconds] : plan::predict_time(c, one, cluster).breakdown)
      if (name == "products") return seconds;
    return -1.0;
  };
  EXPECT_NEAR(products(same), products(none), 1e-12 * products(none));
  EXPECT_NEAR(products(half) / products(none), 2.0, 0.05);  // compute-bound products at half the rate

  // The table shipped beside the presets reads as a full grid.
  const Cluster h100 = plan::parse_cluster(
      test::replaced_text(kCluster, "memory_gbs = 1000", with + "tables/h100_matmul_bf16_openxla.csv\""),
      test::source_path("clusters/any.toml"));
  EXPECT_GT(h100.device.product_tflops(true, 16384, 4096, 4096), 700);
  EXPECT_LT(h100.device.product_tflops(true, 256, 256, 256), 10);
  EXPECT_EQ(h100.device.product_tflops(false, 16384, 4096, 4096), 16);  // fp32: the flat rate
}

TEST(CostModel, CollectivesTakeTheirAlgorithmsTime) {
  const Cluster::Tier t{10e9, 1e-5, true};
  EXPECT_DOUBLE_EQ(plan::all_reduce_seconds(1e9, 4, t), 2 * 3.0 / 4 * 0.1 + 4 * 1e-5);  // a tree of depth 2
  EXPECT_DOUBLE_EQ(plan::all_reduce_seconds(1e9, 3, t), 2 * 2.0 / 3 * 0.1 + 4 * 1e-5);  // the ring's 2 steps
  EXPECT_DOUBLE_EQ(plan::all_reduce_seconds(0, 1024, t), 2 * 10 * 1e-5);
  EXPECT_DOUBLE_EQ(plan::all_gather_seconds(1e9, 4, t), 3.0 / 4 * 0.1 + 3 * 1e-5);
  EXPECT_DOUBLE_EQ(plan::send_seconds(1e9, t), 0.1 + 1e-5);
  EXPECT_EQ(plan::all_reduce_seconds(1e9, 1, t), 0);
  // A call's overhead (intra_node.call_overhead_us) once per call, whatever its steps.
  Cluster::Tier loaded = t;
  loaded.call_overhead_s = 2e-3;
  EXPECT_DOUBLE_EQ(plan::all_reduce_seconds(1e9, 4, loaded), plan::all_reduce_seconds(1e9, 4, t) + 2e-3);
  EXPECT_DOUBLE_EQ(plan::all_gather_seconds(1e9, 4, loaded), plan::all_gather_seconds(1e9, 4, t) + 2e-3);
  EXPECT_DOUBLE_EQ(plan::send_seconds(1e9, loaded), plan::send_seconds(1e9, t) + 2e-3);
  EXPECT_EQ(plan::all_reduce_seconds(1e9, 1, loaded), 0);
}

// On a CPU "device" whose every core computes (a rank per core), a collective's copying and summing
// take a core from the backward beside them: the reduction is exposed whole (its last bucket
// counted once, not again as the bucket no backward hides); with a core to spare
// the backward hides it. Under tp each of its collective calls pays the call overhead once,
// Megatron-SP's all-gather and reduce-scatter twice, and its gradient shares' one sum a step once.
TEST(CostModel, OnACpuWhoseEveryCoreComputesNothingHidesACollective) {
  Cluster full = plan::load_cluster(test::source_path("clusters/this_machine_2core.toml"));
  full.intra_node.call_overhead_us = 0;
  Cluster spare = full;
  spare.cluster.devices_per_node = 4;
  Config c = test::planner_config();
  c.train.device = "cpu";
  c.parallel.dp = 2;
  c.parallel.bucket_mb = 0.1;  // several buckets
  const ParallelDims dims(c.parallel, 2, "test");
  const double exposed = test::breakdown_term(plan::predict(c, dims, full), "dp_reduction_exposed");
  const double hidden = test::breakdown_term(plan::predict(c, dims, spare), "dp_reduction_exposed");
  EXPECT_LT(hidden, exposed);
  // Exposed whole and once: every bucket's collective, the last one not added again.
  const double weights = plan::price_operations(c, dims, full).total().parameters;
  const double buckets = std::ceil(4 * weights / (c.parallel.bucket_mb * 1e6));
  ASSERT_GT(buckets, 1);
  EXPECT_NEAR(exposed,
              plan::all_reduce_seconds(4 * weights, 2, full.tier({0, 1})) +
                  (buckets - 1) * plan::all_reduce_seconds(0, 2, full.tier({0, 1})),
              1e-12);

  Config tp = test::planner_config();
  tp.train.device = "cpu";
  tp.parallel.tp = 2;
  const ParallelDims tp_dims(tp.parallel, 2, "test");
  Cluster overhead = full;
  overhead.intra_node.call_overhead_us = 1000;
  for (const bool megatron_sp : {false, true}) {
    tp.parallel.megatron_sp = megatron_sp;
    const double added = test::breakdown_term(plan::predict(tp, tp_dims, overhead), "tp_communication") -
                         test::breakdown_term(plan::predict(tp, tp_dims, full), "tp_communication");
    // Per micro-batch two all-reduces a block each way (Megatron-SP: their all-gather and
    // reduce-scatter, and the re-gather for each column product's weight gradient).
    const double m = static_cast<double>(plan::predict(tp, tp_dims, full).micro_batches);
    const double calls = megatron_sp ? 2 * 2 * 2 + 2 : 2 * 2;
    EXPECT_NEAR(added, m * static_cast<double>(tp.model.n_layer) * calls * 1e-3, 1e-9) << megatron_sp;
    // The gradient shares (Megatron-SP: a block's two norms' weights and biases and its two
    // row-parallel biases, and ln_f's weight and bias): one all-reduce a step, one call whatever
    // the micro-batches, of their float32 elements.
    const double sum_added = test::breakdown_term(plan::predict(tp, tp_dims, overhead), "tp_gradient_sum") -
                             test::breakdown_term(plan::predict(tp, tp_dims, full), "tp_gradient_sum");
    EXPECT_NEAR(sum_added, megatron_sp ? 1e-3 : 0, 1e-9) << megatron_sp;
    if (megatron_sp) {
      const double C = static_cast<double>(tp.model.n_embd), L = static_cast<double>(tp.model.n_layer);
      EXPECT_NEAR(test::breakdown_term(plan::predict(tp, tp_dims, full), "tp_gradient_sum"),
                  plan::all_reduce_seconds(4 * (6 * C * L + 2 * C), 2, full.tier({0, 1})), 1e-12);
    }
  }
}

// Key/value heads fewer than the tp ranks: each rank's chunk of a shared head's kv_proj gradient is
// a share, summed once a step among the ranks holding it (tp / n_kv_head of them): one all-reduce
// of every block's chunk in float32, one call whatever the micro-batches; at ZeRO-2 this rank's
// shard of them. None where every rank holds its own heads.
TEST(CostModel, SharedKeyValueHeadsSumTheirGradientsOnceAStep) {
  const Cluster cluster = plan::load_cluster(test::source_path("clusters/this_machine_2core.toml"));
  for (const int64_t kv_heads : {1, 2})
    for (const int64_t zero_stage : {0, 2}) {
      Config c = test::planner_config();
      c.train.device = "cpu";
      c.model = ModelOptions::from_preset("tiny_llama");
      c.model.n_kv_head = kv_heads;
      c.parallel.tp = 2;
      c.parallel.dp = 2;
      c.parallel.zero_stage = zero_stage;
      const ParallelDims dims(c.parallel, 4, "test");
      const double sum = test::breakdown_term(plan::predict(c, dims, cluster), "tp_gradient_sum");
      const double d = static_cast<double>(c.model.head_width()), C = static_cast<double>(c.model.n_embd);
      const double chunk = static_cast<double>(c.model.n_layer) * 2 * d * C / (zero_stage >= 2 ? 2 : 1);
      if (kv_heads < c.parallel.tp)
        EXPECT_NEAR(sum, plan::all_reduce_seconds(4 * chunk, 2, cluster.tier({0, 1})), 1e-12) << zero_stage;
      else
        EXPECT_EQ(sum, 0) << zero_stage;
    }
}

// The products each block kind declares, forward + input and weight gradients (3x), over the
// blocks, the embedding and the head: the model's own FLOPs per token x tokens (norm weights and
// biases are in flops_per_token's 6 N but are no products: a few parts in 10^4), and the weights
// they declare the model's parameter count.
void expect_operations_count_the_models_flops(ModelOptions m, int64_t seq_len) {
  OperationShape shape;
  shape.batch = 2;
  shape.seq_len = seq_len;
  double flops = 0, parameters = 0;
  auto add = [&](const std::vector<Operation>& ops) {
    for (const Operation& op : ops) {
      if (op.kind == Operation::Kind::matmul) flops += 3 * op.flops;
      parameters += op.parameters;
    }
  };
  for (int64_t layer = 0; layer < m.n_layer; ++layer) add(block_operations(m, layer, shape));
  add(embedding_operations(m, shape));
  add(head_operations(m, shape));
  const double expected = flops_per_token(m, seq_len) * static_cast<double>(2 * seq_len);
  EXPECT_NEAR(flops / expected, 1.0, 3e-3) << m.preset << " " << m.arch;
  // The weights they declare: the model's parameters but its norms' weights and biases.
  EXPECT_NEAR(parameters / static_cast<double>(parameter_count(m)), 1.0, 1e-2) << m.preset << " " << m.arch;
}

TEST(Operations, TheProductsOfEveryBlockKindAreTheModelsFlops) {
  for (const char* preset : {"gpt2_124m", "tiny_llama", "tiny_qwen3", "tiny_mixtral", "tiny_deepseek", "llama3_8b"}) {
    ModelOptions m = ModelOptions::from_preset(preset);
    m.moe_capacity_factor = 0;  // dropless: each token's top_k experts exactly
    expect_operations_count_the_models_flops(m, 128);
  }
  ModelOptions linear = ModelOptions::from_preset("tiny_gpt");
  linear.arch = "linear";
  linear.bias = false;  // at width 128 its biases are 0.7% of the parameters, and no products
  expect_operations_count_the_models_flops(linear, 256);
}

TEST(Operations, TensorParallelismSplitsTheProductsAndAddsTwoAllReducesPerBlock) {
  const ModelOptions m = ModelOptions::from_preset("gpt2_124m");
  OperationShape one, two;
  one.seq_len = two.seq_len = 256;
  two.tp = 2;
  double f1 = 0, f2 = 0;
  int reduces = 0;
  for (const Operation& op : block_operations(m, 0, one)) f1 += op.flops;
  for (const Operation& op : block_operations(m, 0, two)) {
    f2 += op.flops;
    reduces += op.kind == Operation::Kind::tp_all_reduce;
  }
  EXPECT_NEAR(f2 / f1, 0.5, 1e-12);
  EXPECT_EQ(reduces, 2);
}

// Hierarchical dispatch's rows leaving a rank per token (operations.h), 16 experts top 4 over
// ep = 4 ranks on two nodes: node-limited (2 groups, the best one) a token reaches one node, the
// other one half the time, and within it 2 (1 - C(4, 4) / C(8, 4)) ranks, the other one half of
// those; unlimited it reaches 2 (1 - C(8, 4) / C(16, 4)) nodes. Each row carries x, the k gates
// and the k int32 ids (k more float32 elements); the combine returns x's width. Per rank the
// rows equal what bench/results/expert_dispatch_cpu.md measured within 2% (docs/moe.md).
TEST(Operations, HierarchicalDispatchSendsEachTokenOncePerNodeItNeeds) {
  ModelOptions m = ModelOptions::from_preset("tiny_deepseek");
  OperationShape shape;
  shape.batch = 8;
  shape.seq_len = 128;
  shape.ep = 4;
  shape.ep_nodes = 2;
  shape.ep_hierarchical = true;
  shape.element_bytes = 4;
  const double T = 1024, h = 128, k = 4;
  auto elements = [&](const std::string& name) {
    for (const Operation& op : block_operations(m, 1, shape))
      if (op.name == name) return op.elements;
    ADD_FAILURE() << "no operation " << name;
    return 0.0;
  };
  for (const bool limited : {true, false}) {
    SCOPED_TRACE(limited ? "node-limited" : "unlimited");
    m.moe_groups = limited ? 2 : 1;
    m.moe_topk_groups = limited ? 1 : 0;
    const double nodes = limited ? 1 : 2 * (1 - 70.0 / 1820);
    const double ranks = limited ? 2 * (1 - 1.0 / 70) : 2 * (1 - 6.0 / 28);  // 4 or 2 choices in a node of 8
    EXPECT_NEAR(elements("moe.dispatch.between_nodes"), T * nodes / 2 * (h + 2 * k), 1e-6);
    EXPECT_NEAR(elements("moe.combine.between_nodes"), T * nodes / 2 * h, 1e-6);
    EXPECT_NEAR(elements("moe.dispatch.within_node"), T * nodes * ranks / 2 * (h + 2 * k), 1e-6);
  }
  // One node: no hop between nodes; alltoall: neither hop.
  shape.ep_nodes = 1;
  for (const Operation& op : block_operations(m, 1, shape)) EXPECT_NE(op.kind, Operation::Kind::ep_between_nodes);
  shape.ep_hierarchical = false;
  for (const Operation& op : block_operations(m, 1, shape)) EXPECT_NE(op.kind, Operation::Kind::ep_within_node);
}

// Priced per hop: on two nodes of two joined by a slow link the hierarchical dispatch's expert
// communication is less than the all-to-all's, and less again under node-limited routing; on a
// fast link the all-to-all's one call each way is the cheaper. The search tries both dispatches
// where ep > 1 and picks the hierarchical one over the slow link.
TEST(CostModel, HierarchicalDispatchIsPricedPerHop) {
  Config c = test::planner_config();
  c.model = ModelOptions::from_preset("tiny_deepseek");
  c.train.seq_len = 128;
  c.train.batch_size = 4;
  c.train.grad_accum = 1;
  c.parallel.ep = 4;
  Cluster slow = plan::parse_cluster(test::replaced_text(kCluster, "devices_per_node = 4", "devices_per_node = 2"), "t");
  slow.inter_node.bandwidth_gbs = 0.0125;  // 100 Mbit
  const ParallelDims dims(c.parallel, 4, "test");
  auto ep_seconds = [&](const Cluster& cluster, const std::string& dispatch, bool limited) {
    Config v = c;
    v.parallel.ep_dispatch = dispatch;
    v.model.moe_groups = limited ? 2 : 1;
    v.model.moe_topk_groups = limited ? 1 : 0;
    return test::breakdown_term(plan::predict(v, dims, cluster), "ep_communication");
  };
  const double a2a = ep_seconds(slow, "alltoall", false), hier = ep_seconds(slow, "hierarchical", false);
  const double limited = ep_seconds(slow, "hierarchical", true);
  EXPECT_LT(hier, 0.6 * a2a);
  EXPECT_LT(limited, 0.6 * hier);
  Cluster fast = slow;
  fast.inter_node = fast.intra_node;
  fast.intra_node.call_overhead_us = fast.inter_node.call_overhead_us = 500;
  EXPECT_LT(ep_seconds(fast, "alltoall", false), ep_seconds(fast, "hierarchical", false));

  const plan::SearchResult found =
      plan::search_layouts(c, 4,
                           {"parallel.tp", "parallel.pp", "parallel.sp", "parallel.ep", "train.batch_size",
                            "memory.activation_checkpointing", "parallel.zero_stage", "parallel.offload", "memory.swap"},
                           slow, check_parallel_layout, 8);
  std::set<std::string> dispatches;
  for (const plan::Candidate& l : found.layouts)
    for (const auto& [key, value] : l.set)
      if (key == "parallel.ep_dispatch") dispatches.insert(value);
  EXPECT_EQ(dispatches, (std::set<std::string>{"alltoall", "hierarchical"}));
  ASSERT_FALSE(found.layouts.empty());
  bool best_hierarchical = false;
  for (const auto& [key, value] : found.layouts.front().set)
    best_hierarchical |= key == "parallel.ep_dispatch" && value == "hierarchical";
  EXPECT_TRUE(best_hierarchical);
}

// The routed experts' gradients reduce over their own replicas (edp: dp / ep ranks), the rest over
// the data replicas. 16 more experts: at ep = dp = 4 (no expert replica) the reduction grows only
// by the router's wider weights (replicated); at ep = 2 by the all-reduce of the 8 added experts
// per rank over two ranks, and at most their bytes again for the last bucket. On a CPU whose every
// core computes, the reduction is exposed whole.
TEST(CostModel, ExpertGradientsReduceOverTheirOwnReplicas) {
  const Cluster cluster = plan::load_cluster(test::source_path("clusters/this_machine_2core.toml"));
  Config c = test::planner_config();
  c.model = ModelOptions::from_preset("tiny_deepseek");
  c.train.device = "cpu";
  c.train.seq_len = 128;
  c.train.grad_accum = 1;
  c.parallel.bucket_mb = 1000;  // one bucket
  auto reduction = [&](int64_t ep, int64_t experts) {
    Config v = c;
    v.parallel.ep = ep;
    v.model.moe_experts = experts;
    const ParallelDims dims(v.parallel, 4, "test");
    return test::breakdown_term(plan::predict(v, dims, cluster), "dp_reduction_exposed");
  };
  // 3 MoE blocks of SwiGLU experts (3 C H each), 8 added on each ep = 2 rank.
  const double added = 3.0 * 8 * 3 * static_cast<double>(c.model.n_embd * c.model.expert_hidden());
  Config half = c;
  half.parallel.ep = 2;
  const std::vector<int64_t> expert_replicas = ParallelDims(half.parallel, 4, "test").group_of("edp", 0);
  ASSERT_EQ(expert_replicas.size(), 2u);
  const plan::Cluster::Tier tier = cluster.tier(expert_replicas);
  const double experts_reduce = plan::all_reduce_seconds(4 * added, 2, tier) - plan::all_reduce_seconds(0, 2, tier);
  const double at_two = reduction(2, 32) - reduction(2, 16), at_four = reduction(4, 32) - reduction(4, 16);
  EXPECT_GT(at_two, experts_reduce);
  EXPECT_LT(at_two, 1.05 * (experts_reduce + 4 * added / tier.bandwidth_bytes_per_s));
  EXPECT_LT(at_four, 0.05 * at_two);
}

// What breakdown `term` loses when device.memory_gbs doubles: half of what it spends at the memory rate.
double saved_at_twice_the_memory_rate(const Config& c, const ParallelDims& dims, const Cluster& cluster,
                                      const std::string& term) {
  Cluster faster = cluster;
  faster.device.memory_gbs *= 2;
  return test::breakdown_term(plan::predict(c, dims, cluster), term) -
         test::breakdown_term(plan::predict(c, dims, faster), term);
}

// Tensor parallelism's collectives copy their tensors around the call (parallel/tensor/tp_comm.cpp):
// an all-reduce into a copy of its input, Megatron-SP's sequence all-gather and reduce-scatter with
// the sequence dimension moved to the front and back. Those copies are priced at the memory rate:
// halving it (doubling device.memory_gbs) takes exactly half of them off the tp term.
TEST(CostModel, TensorParallelCollectivesPayForTheirCopies) {
  const Cluster cluster = plan::load_cluster(test::source_path("clusters/this_machine_2core.toml"));
  Config c = test::planner_config();
  c.train.device = "cpu";
  c.parallel.tp = 2;
  const ParallelDims dims(c.parallel, 2, "test");
  const double tensor = static_cast<double>(c.train.batch_size * c.train.seq_len * c.model.n_embd) * 4;  // fp32
  const double bandwidth = 1e9 * cluster.device.memory_gbs / cluster.cluster.memory_slowdown(2);
  const double m = static_cast<double>(plan::predict(c, dims, cluster).micro_batches);
  const double regions = 2 * static_cast<double>(c.model.n_layer);  // attention's and the MLP's
  for (const bool megatron_sp : {false, true}) {
    c.parallel.megatron_sp = megatron_sp;
    // Forward and backward: one all-reduce each (2 x the tensor), or an all-gather and a
    // reduce-scatter each plus the weight gradient's gather (5 x 2 x 1.5 x the tensor at N = 2).
    const double moved = megatron_sp ? 5 * 2 * 1.5 * tensor : 2 * 2 * tensor;
    const double copies = m * regions * moved / bandwidth;
    EXPECT_NEAR(saved_at_twice_the_memory_rate(c, dims, cluster, "tp_communication"), copies / 2, 1e-9 * copies)
        << megatron_sp;
  }
}

// The planner's test model on a CPU, its sequence split over sp = 2 by `method`.
Config two_sequence_shards(const std::string& method) {
  Config c = test::planner_config();
  c.train.device = "cpu";
  c.parallel.sp = 2;
  c.parallel.sp_method = method;
  return c;
}

// Ring attention (parallel/sequence/ring_attention.cpp): the keys and values go to the next rank
// at each of sp - 1 steps forward and again backward, and the backward sends their float32
// gradients' accumulator around the whole ring, sp send-receives.
TEST(CostModel, RingAttentionSendsItsGradientsAroundTheRing) {
  const Cluster cluster = plan::load_cluster(test::source_path("clusters/this_machine_2core.toml"));
  const Config c = two_sequence_shards("ring");
  const ParallelDims dims(c.parallel, 2, "test");
  const plan::PricedOperations priced = plan::price_operations(c, dims, cluster);
  const double kv = static_cast<double>(c.train.batch_size * c.train.seq_len / 2 * 2 * c.model.n_embd);
  const plan::Cluster::Tier tier = cluster.tier(dims.group_of("sp", 0));
  const double per_block = 2 * plan::send_seconds(kv * static_cast<double>(priced.shape.element_bytes), tier) +
                           2 * plan::send_seconds(kv * 4, tier);
  const double m = static_cast<double>(plan::predict(c, dims, cluster).micro_batches);
  EXPECT_NEAR(test::breakdown_term(plan::predict(c, dims, cluster), "sp_communication"),
              m * static_cast<double>(c.model.n_layer) * per_block, 1e-12);
}

// Ulysses permutes each exchanged tensor into the all-to-all's layout and back
// (parallel/sequence/ulysses.cpp): two copies of q, k, v and the output each way, priced at the
// memory rate, so doubling it takes exactly half of them off the sp term.
TEST(CostModel, UlyssesPaysForItsLayoutCopies) {
  const Cluster cluster = plan::load_cluster(test::source_path("clusters/this_machine_2core.toml"));
  const Config c = two_sequence_shards("ulysses");
  const ParallelDims dims(c.parallel, 2, "test");
  const plan::PricedOperations priced = plan::price_operations(c, dims, cluster);
  // q, k, v and the output: 4 x this rank's tokens x the width, exchanged forward and backward.
  const double exchanged = 4.0 * static_cast<double>(c.train.batch_size * c.train.seq_len / 2 * c.model.n_embd) *
                           static_cast<double>(priced.shape.element_bytes);
  const double bandwidth = 1e9 * cluster.device.memory_gbs / cluster.cluster.memory_slowdown(2);
  const double m = static_cast<double>(plan::predict(c, dims, cluster).micro_batches);
  const double copies = m * static_cast<double>(c.model.n_layer) * 2 * 4 * exchanged / bandwidth;
  EXPECT_NEAR(saved_at_twice_the_memory_rate(c, dims, cluster, "sp_communication"), copies / 2, 1e-9 * copies);
}

// Dropless routing under ep: every exchange waits for the busiest rank, whose experts run
// expert_load times an even share of the rows. The experts' products alone grow by that factor;
// capacity routing (its capacity's slots whatever the load) and one rank holding every expert are
// unchanged; a load under 1 is refused by its flag.
TEST(CostModel, DroplessExpertsArePricedAtTheBusiestRanksLoad) {
  const Cluster cluster = plan::load_cluster(test::source_path("clusters/this_machine_2core.toml"));
  Config c = test::planner_config();
  c.model = ModelOptions::from_preset("tiny_mixtral");
  c.model.moe_capacity_factor = 0;
  c.train.device = "cpu";
  c.parallel.ep = 2;
  OperationShape shape;
  shape.ep = 2;
  const std::vector<Operation> even = block_operations(c.model, 0, shape);
  shape.expert_load = 1.5;
  const std::vector<Operation> busiest = block_operations(c.model, 0, shape);
  ASSERT_EQ(even.size(), busiest.size());
  int64_t experts = 0;
  for (size_t i = 0; i < even.size(); ++i) {
    const bool expert_product = even[i].name.rfind("moe.experts", 0) == 0 && even[i].kind == Operation::Kind::matmul;
    experts += expert_product ? 1 : 0;
    EXPECT_DOUBLE_EQ(busiest[i].flops, (expert_product ? 1.5 : 1.0) * even[i].flops) << even[i].name;
  }
  EXPECT_GE(experts, 2);

  auto step = [&](const Config& config, double load) {
    plan::CostOptions options;
    options.expert_load = load;
    const ParallelDims dims(config.parallel, 2, "test");
    return plan::predict(config, dims, cluster, options).step_s;
  };
  EXPECT_GT(step(c, 1.5), step(c, 1.0));
  Config capacity = c;
  capacity.model.moe_capacity_factor = 1.25;
  EXPECT_DOUBLE_EQ(step(capacity, 1.5), step(capacity, 1.0));
  Config one_rank = c;
  one_rank.parallel.ep = 1;
  EXPECT_DOUBLE_EQ(step(one_rank, 1.5), step(one_rank, 1.0));
  EXPECT_THROW(step(c, 0.5), Error);
}

// The optimizer step runs where its state lives: on a CPU "device" in host memory, at the rate the
// file measured for AdamW's step there (host.optimizer_gbs, as offload's and swap's host steps);
// on a card at the card's memory rate.
TEST(CostModel, TheOptimizerStepIsPricedAtTheRateOfTheMemoryItRunsIn) {
  Config c = test::planner_config();
  c.train.device = "cpu";
  const ParallelDims dims(c.parallel, 1, "test");
  const Cluster cpu = plan::load_cluster(test::source_path("clusters/this_machine_2core.toml"));
  auto optimizer = [&](const Cluster& cluster) {
    return test::breakdown_term(plan::predict(c, dims, cluster), "optimizer");
  };
  Cluster faster_host = cpu, faster_device = cpu;
  faster_host.host.optimizer_gbs *= 2;
  faster_device.device.memory_gbs *= 2;
  EXPECT_NEAR(optimizer(faster_host), optimizer(cpu) / 2, 1e-12);
  EXPECT_DOUBLE_EQ(optimizer(faster_device), optimizer(cpu));
  const double weights = plan::price_operations(c, dims, cpu).total().parameters;
  EXPECT_NEAR(optimizer(cpu), weights * (28 + 4) / (1e9 * cpu.host.optimizer_gbs), 1e-12);

  Cluster card = cpu;
  card.device.kind = "cuda";
  Cluster card_faster_host = card, card_faster_memory = card;
  card_faster_host.host.optimizer_gbs *= 2;
  card_faster_memory.device.memory_gbs *= 2;
  EXPECT_DOUBLE_EQ(optimizer(card_faster_host), optimizer(card));
  EXPECT_NEAR(optimizer(card_faster_memory), optimizer(card) / 2, 1e-12);
}

TEST(CostModel, TheStepIsItsPartsAndGrowsByOneMicroBatchesWork) {
  const Cluster cluster = test_cluster();
  Config c = test::planner_config();
  const ParallelDims one(c.parallel, 1, "test");
  const plan::Prediction four = plan::predict(c, one, cluster);
  EXPECT_NEAR(test::breakdown_sum(four), four.step_s, 1e-12);
  c.train.grad_accum = 8;
  const plan::Prediction eight = plan::predict(c, one, cluster);
  // One process: the step is m x (F + I + W) and the optimizer step.
  const double optimizer = four.breakdown.back().second;
  EXPECT_NEAR((eight.step_s - optimizer) / (four.step_s - optimizer), 2.0, 1e-9);
  EXPECT_NEAR(eight.tokens_per_s / four.tokens_per_s, (8 / eight.step_s) / (4 / four.step_s), 1e-9);

  // A pipeline: the simulator's step, with a bubble, still its parts.
  c.parallel.pp = 2;
  const ParallelDims pipe(c.parallel, 2, "test");
  const plan::Prediction piped = plan::predict(c, pipe, cluster);
  EXPECT_NEAR(test::breakdown_sum(piped), piped.step_s, 1e-9 * piped.step_s);
  double bubble = 0;
  for (const auto& [name, seconds] : piped.breakdown)
    if (name == "pipeline_bubble_and_transfers") bubble = seconds;
  EXPECT_GT(bubble, 0);
}

TEST(CostModel, WhatItDoesNotModelIsRefusedByKey) {
  Config c = test::planner_config();
  c.parallel.pp_schedule = "file:my_table.csv";
  EXPECT_TRUE(test::throws_naming([&] { plan::check_modelled(c); }, {"parallel.pp_schedule", "not modelled"}));

}

// The search's bound (step_lower_bound) is never above the step the table gives, for every
// schedule, ZeRO stage and micro-batch count of a 4-stage pipeline over two nodes (the transfers
// and the reduction cross the slow tier); it is the step without a pipeline and, with one
// micro-batch, within a few percent of it: one chain through every stage, which the bound counts
// with its transfers and the OPTIM that ends it.
TEST(CostModel, TheLowerBoundHoldsForEverySchedule) {
  const Cluster cluster = test_cluster();  // 4 devices per node
  Config c = test::planner_config();
  c.model.n_layer = 8;
  int64_t checked = 0;
  for (const int64_t pp : {1, 4})
    for (const char* schedule : {"1f1b", "gpipe", "zbh1", "zbv", "interleaved"})
      for (const int64_t zero : {0, 1, 3})
        for (const int64_t m : {1, 2, 4, 8}) {
          c.parallel.pp = pp, c.parallel.pp_schedule = schedule, c.parallel.zero_stage = zero;
          c.parallel.pp_virtual = std::string(schedule) == "interleaved" ? 2 : 0;
          c.train.grad_accum = m;
          try {
            c.check("test");
            const ParallelDims dims(c.parallel, 2 * pp, "test");  // dp 2: the pipeline's pairs on two nodes
            check_layout_options(c, dims);
            const double bound = plan::step_lower_bound(c, dims, cluster, plan::price_operations(c, dims, cluster));
            const double step = plan::predict_time(c, dims, cluster).step_s;
            ++checked;
            EXPECT_LE(bound, step * (1 + 1e-12)) << schedule << " pp " << pp << " zero " << zero << " m " << m;
            if (pp == 1) {
              EXPECT_NEAR(bound, step, 1e-12 * step);
            }
            if (m == 1 && pp > 1) {
              EXPECT_GT(bound, 0.95 * step) << schedule << " zero " << zero;
            }
          } catch (const Error&) {  // a schedule that needs more micro-batches (interleaved: m % pp)
          }
        }
  EXPECT_GE(checked, 60);
}

// PowerSGD's bytes: each block's gradients travel as r'(n + m) elements per weight matrix viewed as
// [size(0), rest] where that is fewer than n m, the rest whole: the compressor's own rule applied to
// the model's own matrices (built on the meta device; the operations declare no biases or norm
// weights, a fraction of a percent of a model), against what the operations declare. On a
// link slow enough that the reduction is the step, PowerSGD's and top-k's reductions cost their
// bytes.
TEST(CostModel, CompressedReductionsAreTheirCompressorsBytes) {
  const Cluster cluster = test_cluster();
  Config c = test::planner_config();
  c.parallel.grad_compression = "powersgd";
  c.parallel.powersgd_rank = 4;
  const ParallelDims one(c.parallel, 1, "test");
  const TransformerLM meta(c.model, ModelStage{}, at::TensorOptions().device(at::kMeta));
  double expected = 0;
  for (const auto& item : meta->named_parameters()) {
    if (meta->parameter_specs().at(item.key()).block != 0) continue;
    const at::Tensor& t = item.value();
    const double n = static_cast<double>(t.size(0)), m = static_cast<double>(t.numel()) / n;
    const double r = std::min({n, m, 4.0});
    if (t.dim() >= 2) expected += r * (n + m) < n * m ? r * (n + m) : n * m;  // the operations declare no vectors
  }
  EXPECT_DOUBLE_EQ(plan::price_operations(c, one, cluster).blocks[0].lowrank, expected);

  const Cluster slow = plan::parse_cluster(test::replaced_text(kCluster, "bandwidth_gbs = 100", "bandwidth_gbs = 0.0001"),
                                           "slow.toml");
  const ParallelDims two(c.parallel, 2, "test");
  const plan::PartCost all = plan::price_operations(c, two, slow).total();
  const double lowrank = all.lowrank, params = all.parameters;
  ASSERT_LT(lowrank, params / 2);
  const double compressed = test::breakdown_term(plan::predict_time(c, two, slow), "dp_reduction_exposed");
  c.parallel.grad_compression = "none";
  const double plain = test::breakdown_term(plan::predict_time(c, two, slow), "dp_reduction_exposed");
  // Both: the reduction's bytes over the link less the backward beside it, plus the last bucket.
  EXPECT_NEAR((compressed - plain) / (4 * (lowrank - params) / 0.0001e9), 1.0, 0.05);
  c.parallel.grad_compression = "topk";
  c.parallel.topk_ratio = 0.01;
  const double topk = test::breakdown_term(plan::predict_time(c, two, slow), "dp_reduction_exposed");
  // Two replicas: an all-gather moves the other's 8-byte pairs, a ring all-reduce 4 bytes per entry.
  EXPECT_NEAR((topk - plain) / ((8 * std::ceil(0.01 * params) - 4 * params) / 0.0001e9), 1.0, 0.05);
}

// On a slow link a pipeline's step is its sends one after another: each rank's sends leave through
// its one link in turn. GPipe's four forwards leave stage 0 back to back, and its backwards wait for
// the last of them, so the link carries the four micro-batches' activations, then their gradients
// back: 2m x (bytes / bandwidth + latency). 1F1B sends a gradient back while the next activations
// come: its two directions overlap, but no schedule beats one direction's m sends.
TEST(CostModel, ASlowPipelineLinkCarriesItsSendsOneAfterAnother) {
  const Cluster slow = plan::parse_cluster(test::replaced_text(kCluster, "bandwidth_gbs = 100", "bandwidth_gbs = 0.0001"),
                                           "slow.toml");
  Config c = test::planner_config();
  c.parallel.pp = 2, c.parallel.pp_schedule = "gpipe";
  const ParallelDims dims(c.parallel, 2, "test");
  const plan::Prediction p = plan::predict_time(c, dims, slow);
  const double send = 2.0 * 64 * 32 * 4 / 0.0001e9 + 5e-6;  // a micro-batch's float32 activations
  EXPECT_NEAR(p.step_s, 8 * send + test::breakdown_term(p, "optimizer"), 1e-4);
  EXPECT_NEAR(test::breakdown_sum(p), p.step_s, 1e-9);
  EXPECT_LE(plan::step_lower_bound(c, dims, slow, plan::price_operations(c, dims, slow)), p.step_s * (1 + 1e-12));
  c.parallel.pp_schedule = "1f1b";
  const plan::Prediction one_f_one_b = plan::predict_time(c, dims, slow);
  EXPECT_LT(one_f_one_b.step_s, 0.75 * p.step_s);
  EXPECT_GT(one_f_one_b.step_s, 4 * send);
}

// The search against brute force on a small case: every layout of 4 ranks predicted one by one,
// the best kept; the search's best is the same step, and held keys are held.
TEST(Search, ItsBestIsTheBruteForceBestAndHeldKeysAreHeld) {
  const Cluster cluster = test_cluster();
  Config base = test::planner_config();
  base.model.n_layer = 2;
  base.train.global_batch_size = 8;
  base.train.grad_accum = 1;
  const plan::SearchResult result = plan::search_layouts(base, 4, {}, cluster, check_layout_options, 3);
  ASSERT_FALSE(result.layouts.empty());
  EXPECT_LE(result.refused + result.predicted, result.considered);
  EXPECT_EQ(result.layouts.size(), 3u);  // everything fits this small model
  for (size_t i = 1; i < result.layouts.size(); ++i)
    if (result.layouts[i].prediction.fits == result.layouts[i - 1].prediction.fits) {
      EXPECT_LE(result.layouts[i - 1].prediction.step_s, result.layouts[i].prediction.step_s);
    }

  double best = 1e30;
  int64_t built = 0;
  for (int64_t tp : {1, 2, 4})
    for (int64_t sp : {1, 2, 4})
      for (const char* method : {"ulysses", "ring"})
        for (int64_t pp : {1, 2, 4})
          for (const char* schedule : {"1f1b", "gpipe", "zbh1", "zbv", "interleaved"})
            for (int64_t zero : {0, 1, 2, 3})
              for (bool msp : {false, true})
                for (const char* ckpt : {"none", "selective", "full"})
                  for (int64_t b : {1, 2, 4, 8}) {
                    Config c = base;
                    c.parallel.tp = tp, c.parallel.sp = sp, c.parallel.sp_method = method, c.parallel.pp = pp;
                    c.parallel.pp_schedule = schedule, c.parallel.zero_stage = zero;
                    c.parallel.megatron_sp = msp, c.memory.activation_checkpointing = ckpt, c.train.batch_size = b;
                    try {
                      c.check("test");
                      const ParallelDims dims(c.parallel, 4, "test");
                      check_layout_options(c, dims);
                      best = std::min(best, plan::predict(c, dims, cluster).step_s);
                      ++built;
                    } catch (const std::exception&) {
                    }
                  }
  ASSERT_GT(built, 0);
  EXPECT_NEAR(result.layouts.front().prediction.step_s, best, 1e-12);

  const plan::SearchResult held =
      plan::search_layouts(base, 4, {"parallel.tp", "train.batch_size"}, cluster, check_layout_options, 1000);
  ASSERT_FALSE(held.layouts.empty());
  for (const plan::Candidate& c : held.layouts) {
    EXPECT_EQ(c.dims.tp(), base.parallel.tp);
    EXPECT_EQ(c.config.train.batch_size, base.train.batch_size);
  }
}

// sp with its methods by attention kind (lasp and lasp2 for linear attention, never Ulysses), and
// ep over the experts, are searched; every layout shown carries its keys in the --set line.
// A swarm's batch round with no round overhead measured and its CPU not priced is priced as the
// all-reduce it replaces: on this machine's preset tiny_gpt's two swapped peers and its two
// swapped data-parallel replicas predict within 0.01% of each other, and the layout without a
// swarm is listed first.
TEST(Search, AtAnEqualPredictionTheLayoutWithoutASwarmComesFirst) {
  Cluster cluster = plan::load_cluster(test::source_path("clusters/this_machine_2core.toml"));
  ASSERT_EQ(cluster.peers.round_overhead_ms, 0);
  cluster.peers.cpu_ns_per_byte = 0;
  Config c = test::planner_config();
  c.model = ModelOptions::from_preset("tiny_gpt");
  c.train.device = "cpu";
  c.train.batch_size = 16;
  c.train.global_batch_size = 32;
  c.train.grad_accum = 1;
  c.memory.swap = true;
  c.memory.device_budget_gb = 1;
  const plan::SearchResult found = plan::search_layouts(c, 2, {"train.batch_size", "memory.swap"}, cluster,
                                                        check_parallel_layout, 8);
  ASSERT_GE(found.layouts.size(), 2u);
  const plan::Candidate& first = found.layouts[0];
  EXPECT_EQ(first.peers, 0);
  bool tied_swarm = false;
  for (const plan::Candidate& l : found.layouts)
    tied_swarm |= l.peers > 0 && std::abs(l.prediction.step_s / first.prediction.step_s - 1) < 1e-4;
  EXPECT_TRUE(tied_swarm);
}

TEST(Search, SequenceAndExpertParallelismAreSearched) {
  const Cluster cluster = test_cluster();
  Config linear = test::planner_config();
  linear.model.arch = "linear";
  linear.train.global_batch_size = 8;
  std::set<std::string> methods;
  for (const plan::Candidate& c : plan::search_layouts(linear, 4, {"parallel.tp", "parallel.pp"}, cluster,
                                                       check_layout_options, 1000).layouts) {
    if (c.dims.sp() == 1) continue;
    methods.insert(c.config.parallel.sp_method);
    bool named = false;
    for (const auto& [key, value] : c.set) named = named || (key == "parallel.sp_method" && value == c.config.parallel.sp_method);
    EXPECT_TRUE(named);
  }
  EXPECT_EQ(methods, (std::set<std::string>{"lasp", "lasp2"}));

  Config moe = test::tiny_config(64);
  moe.model = ModelOptions::from_preset("tiny_mixtral");
  moe.train.seq_len = 64;
  moe.train.global_batch_size = 8;
  std::set<int64_t> eps;
  for (const plan::Candidate& c : plan::search_layouts(moe, 4, {"parallel.tp", "parallel.pp", "parallel.sp"}, cluster,
                                                       check_layout_options, 1000).layouts)
    eps.insert(c.dims.ep());
  EXPECT_GT(eps.size(), 1u);  // more than the config's ep = 1
}

}  // namespace
}  // namespace tessera
