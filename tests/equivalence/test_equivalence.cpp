// The equivalence harness: every layout tessera can train, against one process, in one table.
//
// A row is a layout (ranks and [parallel], [memory], [optim], [precision] and [model] settings).
// Its ranks train a small model for kSteps steps through TrainStep, exactly as `tessera train`
// does; rank 0 then trains the same model (same seed) in one process on the same global batch and
// compares, per step:
//   - the loss (the mean over the replicas that ran different data),
//   - the gradient norm before clipping,
//   - every gradient, whole, after the reduction and before the optimizer (TrainStep's observer:
//     ZeRO shards gathered, tensor-parallel shards gathered by their declarations),
// and after the last step every parameter (the Hugging Face-named model state). Losses alone prove
// little: AdamW ignores a constant gradient scale, so gradients x2 move its losses by ~1e-7.
//
// Data: step s's global batch is kRows sequences drawn from seed 100 + s, the same on every rank.
// With D data-parallel ranks and M micro-batches, micro-batch m of dp rank r is the rows
// [(m D + r) B, (m D + r + 1) B), B = kRows / (D M); sequence- and tensor-parallel ranks of a dp
// rank share its rows (TrainStep cuts each rank's sequence chunk). The reference runs the same
// D M micro-batches one after the other: data parallelism is gradient accumulation across ranks,
// and an MoE layer's capacity and load-balancing loss depend on the tokens of one forward, so only
// the same split is the same computation. Rows with model.moe_aux_scope = global (whose balance
// loss counts micro-batch m of every rank together) compare with a reference running M
// micro-batches, micro-batch m being the D ranks' micro-batches m as one (merged_reference).
//
// Tolerances (one table, by precision): the runs differ only in float32 summation order (means per
// rank then over ranks, reductions, the clipping norm over shards, LASP's chunked states).
// The measured worst case of each row is printed by rank 0 ("measured: ...", shown by the parent
// process too: ctest -V -R Equivalence) and recorded in docs/architecture.md.
#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>

#include "memory/activation_offload.h"
#include "model/parameter_census.h"
#include "comm/mesh.h"
#include "distributed/dist_test.h"
#include "parallel/pipeline/schedule_builders.h"
#include "plan/activation_policy.h"
#include "plan/layout.h"
#include "test_util.h"
#include "tiny_config.h"
#if TESSERA_ATOM
#include "atom/swarm.h"
#endif
#include "train/train_step.h"

namespace tessera {
namespace {

constexpr int64_t kSteps = 3;
constexpr int64_t kRows = 8;
constexpr int64_t kSeqLen = 16;

struct Tolerance {
  double loss_rtol, norm_rtol;
  // |g - g_ref| <= atol * max|g_ref| + rtol |g_ref| per tensor: at the first step (the same
  // parameters on both sides) and at later ones (parameters already apart by rounding that Adam
  // amplified where a gradient is near zero).
  double grad_atol_first, grad_atol_later, grad_rtol;
  double param_atol, param_rtol;  // |p - p_ref| <= atol + rtol |p_ref| after the last step
};
// A reduction bug moves a gradient by its own size and a parameter by ~lr (1e-3); rounding moved
// them by at most the measured values in docs/architecture.md (about 10x below these).
const Tolerance kFp32{1e-5, 1e-5, 1e-5, 5e-4, 1e-3, 1e-4, 1e-4};
const Tolerance kBf16{2e-2, 5e-2, 5e-2, 1e-1, 5e-2, 5e-4, 5e-2};
// bf16 under tensor parallelism: each rank rounds its partial product to bf16 before the sum, one
// process rounds the whole product once (and a pipeline's bf16 wire rounds the float32 residual
// stream and its gradient at the stage boundary), so gradient entries near zero can change sign, and Adam
// turns a changed sign into a step of 2 lr: parameters may differ by up to 2 lr per step (6e-3
// after kSteps = 3 at lr 1e-3; measured 3.3e-3). The gradients keep bf16's bounds.
const Tolerance kBf16Sharded{2e-2, 5e-2, 5e-2, 1e-1, 5e-2, 8e-3, 5e-2};
// fp16 gradient compression (parallel.grad_compression = fp16): each rank's gradient is rounded
// to float16 (relative 2^-11) before the mean, so gradients agree to that rounding at the first
// step and Adam turns a changed sign near zero into a step of up to 2 lr, as under bf16.
const Tolerance kFp16Compressed{1e-4, 1e-3, 1e-3, 5e-2, 2e-3, 8e-3, 1e-3};
// fp16 compute (precision.dtype = fp16, masters in float32): activations and gradients rounded to
// float16 (relative 2^-11) in a different grouping of the batch than the reference's.
const Tolerance kFp16{1e-4, 2e-4, 5e-3, 1.5e-2, 1e-2, 6e-4, 1e-2};
// Activations saved as int8 (memory.activation_compression) under a layout whose forward rounds
// differently from one process (tp's partial sums, sp's chunks): the encoding of each element is
// the same function of its value on both sides, but a value within a rounding of a quantization
// boundary lands on either side, and that element moves by one step (1/127 of its group's largest
// magnitude). Measured: gradients 7.1e-4 of max |g| at the first step, 1.2e-3 later; the gradient
// norm 1.0e-5 apart (sp2 LASP with ATen's baseline kernels, session 49), hence 1e-4.
const Tolerance kInt8Sharded{1e-5, 1e-4, 2e-3, 5e-3, 1e-3, 1e-4, 1e-4};
// The same with int4 (memory.activation_compression = int4): an element that lands on the other
// side of a boundary moves by 1/7 of its group's largest magnitude, 18 times int8's step. Measured
// (tp2 Megatron-SP, 2026-12-04): 5.2e-7 of max |g| at the first step, 8.3e-3 later; parameters
// 2.1e-5 apart, loss and gradient norm within 6e-7.
const Tolerance kInt4Sharded{1e-5, 1e-4, 2e-3, 2e-2, 1e-3, 1e-4, 1e-4};
// Activations saved as int8 under a pipeline: the first step's forward is one process's bit for bit,
// so its gradients hold to fp32's bounds; the parameters then differ by the rounding of the weight
// gradients' accumulation (the micro-batches' sum, the split backward's W), and at later steps a
// saved value within that rounding of a quantization boundary may land on the other side, as under
// tp. Measured (session 49, an AVX-512 machine): 8.4e-8 of max |g| at the first step, 6.4e-4
// later; with ATen's baseline kernels (ATEN_CPU_CAPABILITY=default) no boundary was crossed.
const Tolerance kInt8Pipelined{1e-5, 1e-4, 1e-5, 5e-3, 1e-3, 1e-4, 1e-4};
// The same with int4 slots (memory.activation_compression = adaptive, whose tables mix int4 and
// int8), under a pipeline, swapped replicas (whose gradients are averaged on the host) or MoE
// global balance against its merged reference: the first step holds to fp32's bounds, and later
// a crossed boundary moves an element by 1/7 of its group's largest magnitude. Measured (pp2 zbv
// and dp2 pp2 at 7 bits, 2026-12-04): 4.2e-8 of max |g| at the first step, 1.2e-2 later, all of
// it in h.1.ln_1.weight (one element of the norm's int4 input across a boundary: the same
// difference in both layouts); parameters 6.2e-6 apart, gradient norm 3.2e-6. dp2 swap (AdamW):
// 1.3e-7 at the first step, 1.9e-3 later; int4 everywhere in the same row 1.5e-2, int8 6.1e-4,
// every slot kept 1.5e-6. dp2 MoE global balance (dropless): 3.4e-7 at the first step, 6.1e-4 later.
const Tolerance kInt4AfterFirstStep{1e-5, 1e-4, 1e-5, 2e-2, 1e-3, 1e-4, 1e-4};
// Swapping (memory.swap) computes the same operations in the same order as a resident run, only
// on copies of the parameters that travel between host and device: it is held to equality.
const Tolerance kExact{0, 0, 0, 0, 0, 0, 0};

// A row of the table: a layout to train (named Row: plan/layout.h's Layout is what a run computes).
struct Row {
  std::string name;
  int ranks;
  std::function<void(Config&)> set;
  const Tolerance* tolerance = &kFp32;
  // The reference runs micro-batch m of every dp rank as one (M micro-batches of D B rows) instead
  // of D M: what model.moe_aux_scope = global computes (its balance loss counts them together).
  bool merged_reference = false;
  // The ranks are ATOM peers (swarm.sync = batch, atom/swarm.h), each one process training alone,
  // averaging through the swarm: rank r runs the micro-batches dp rank r would.
  bool peers = false;
};

void PrintTo(const Row& layout, std::ostream* os) { *os << layout.name; }

Config base(const std::string& arch = "gpt", const std::string& ffn = "dense") {
  Config c = test::tiny_config(kSeqLen);
  c.model.arch = arch;
  c.model.ffn = ffn;
  c.model.moe_every = 2;
  c.model.bias = false;  // the attention key bias has an exactly zero gradient, which Adam turns into noise
  c.model.linear_chunk = 4;
  c.train.seed = 11;
  c.optim.lr = 1e-3;
  c.optim.warmup_steps = 0;
  c.optim.weight_decay = 0.1;
  c.optim.grad_clip = 1.0;
  return c;
}

// SGD with Nesterov momentum: its update is proportional to the gradient, so a constant
// gradient-scale error moves the parameters (AdamW's would not); lr large enough that the
// parameters move well beyond rounding between steps.
void sgd(Config& c) {
  c.optim.name = "sgd";
  c.optim.lr = 0.1;
  c.optim.momentum = 0.9;
  c.optim.nesterov = true;
}

// pp 2 over four blocks, four micro-batches, `resident` of a rank's held micro-batches kept on the
// device and the rest offloaded (memory.resident_micro_batches), under `schedule`; SGD or AdamW.
std::function<void(Config&)> held_offload(const std::string& schedule, int64_t resident, bool with_sgd) {
  return [=](Config& c) {
    if (with_sgd) sgd(c);
    c.model.n_layer = 4;
    c.parallel.pp = 2;
    c.parallel.pp_schedule = schedule;
    c.train.grad_accum = 4;
    c.memory.resident_micro_batches = resident;
  };
}

// The Llama family's block kinds on the tiny model: RMSNorm, rotary positions (Llama 3.1's scaling
// over an original context shorter than the test's, so that it changes frequencies), SwiGLU of its
// own width, two query heads per key/value head, an untied head, no biases. `qwen3` adds Qwen 3's:
// q/k norms, a head width of its own, a tied head.
void llama(Config& c, bool qwen3 = false) {
  c.model.norm = "rmsnorm";
  c.model.position = "rope";
  c.model.rope_theta = 500000;
  c.model.rope_scaling = "llama3";
  c.model.rope_original_context = 4;
  c.model.mlp = "swiglu";
  c.model.ffn_hidden = 48;
  c.model.n_kv_head = 2;
  c.model.tie_embeddings = qwen3;
  c.model.qk_norm = qwen3;
  if (qwen3) c.model.head_dim = 12;
}

// The layouts the encoded-activation rows repeat for each codec (SGD), with the saved activations
// encoded by `codec`: tp2 with Megatron-SP at width 64, so that a rank's half of a split last
// dimension (32) is whole groups; ZB-V over two ranks, four blocks and four micro-batches.
void tp2_megatron_sp_encoded(Config& c, const char* codec) {
  sgd(c);
  c.model.n_embd = 64;
  c.parallel.tp = 2;
  c.parallel.megatron_sp = true;
  c.memory.activation_compression = codec;
}

void pp2_zbv_encoded_accum4(Config& c, const char* codec) {
  sgd(c);
  c.model.n_layer = 4;
  c.parallel.pp = 2;
  c.parallel.pp_schedule = "zbv";
  c.train.grad_accum = 4;
  c.memory.activation_compression = codec;
}

// Codecs chosen per saved tensor within 7 bits an element: int4, int8 and kept mixed.
void adaptive_at_7_bits(Config& c) {
  c.memory.activation_compression = "adaptive";
  c.memory.activation_bits = 7;
}

void sp2_lasp_encoded(Config& c, const char* codec) {
  sgd(c);
  c.model.arch = "linear";
  c.parallel.sp = 2;
  c.parallel.sp_method = "lasp";
  c.memory.activation_compression = codec;
}

// Mixtral's MoE on the Llama blocks: every block a dropless top-2 of 4 SwiGLU experts, the chosen
// softmax scores renormalized. `deepseek` makes it DeepSeek-V3's: the first block dense, 8
// fine-grained experts of width 16 beside a shared one, top 3 of sigmoid scores renormalized and
// scaled by 2.5 from the best 2 of 4 expert groups, the aux-loss-free selection bias moving the
// routing of later steps.
void mixtral(Config& c, bool deepseek = false) {
  llama(c);
  c.model.ffn = "moe";
  c.model.moe_every = 1;
  c.model.moe_top_k = 2;
  c.model.moe_gates = "renormalized";
  c.model.moe_capacity_factor = 0;
  if (!deepseek) return;
  c.model.moe_dense_layers = 1;
  c.model.moe_experts = 8;
  c.model.moe_top_k = 3;
  c.model.moe_ffn_hidden = 16;
  c.model.moe_shared_experts = 1;
  c.model.moe_score = "sigmoid";
  c.model.moe_routed_scale = 2.5;
  c.model.moe_bias_update_rate = 0.05;
  c.model.moe_groups = 4;
  c.model.moe_topk_groups = 2;
}

// memory.activation_policy = auto on `ranks` ranks with a budget leaving the rank with the most
// model state `blocks` blocks' worth of one micro-batch's activations (plan/activation_policy.h).
void activation_policy(Config& c, int64_t ranks, double blocks) {
  c.memory.activation_policy = "auto";
  c.memory.device_budget_gb = 1;
  const ParallelDims dims(c.parallel, ranks, "row");
  const double gib = 1024.0 * 1024.0 * 1024.0;
  double state = 0;
  for (const ActivationShare& share : activation_shares(c, make_layout(c, dims)))
    state = std::max(state, gib - share.budget_bytes);
  const double keep = activation_options(c, dims, BlockCosts(), false)[0][0].bytes;
  c.memory.device_budget_gb = (state + blocks * keep) / gib;
}

// Four blocks over two pipeline ranks under `schedule`, four micro-batches, SGD, and a budget
// leaving the rank with the most model state three blocks' worth (its two blocks of two held
// micro-batches need four).
void pp2_activation_policy_sgd(Config& c, const std::string& schedule) {
  sgd(c);
  c.model.n_layer = 4;
  c.parallel.pp = 2;
  c.parallel.pp_schedule = schedule;
  c.train.grad_accum = 4;
  activation_policy(c, 2, 3);
}

// A swapped run (memory.swap) on one process: the model in host memory, cut into sub-models.
void swapped(Config& c, std::vector<int64_t> blocks) {
  c.memory.swap = true;
  c.memory.device_budget_gb = 1;
  c.memory.modelled_bandwidth_gbps = 64;
  c.memory.swap_blocks = std::move(blocks);
}

// Data parallelism over 2 ranks with ZeRO-3, or the plain layout (the swarm rows' peers), with the
// saved activations encoded by `codec`.
void dp2_zero3_encoded(Config& c, const char* codec) {
  sgd(c);
  c.parallel.zero_stage = 3;
  c.memory.activation_compression = codec;
}

void plain_encoded(Config& c, const char* codec) {
  sgd(c);
  c.memory.activation_compression = codec;
}

// A layout of the encoded rows (above) with int4, the attention core at int8
// (memory.attention_compression).
std::function<void(Config&)> core_at_int8(void (*layout)(Config&, const char*)) {
  return [layout](Config& c) {
    layout(c, "int4");
    c.memory.attention_compression = "int8";
  };
}

// Mixtral's blocks over ep 2, and a swapped run of two sub-models of two blocks with two
// micro-batches, each with its saved activations encoded by `codec`.
void ep2_mixtral_encoded(Config& c, const char* codec) {
  mixtral(c);
  sgd(c);
  c.parallel.ep = 2;
  c.memory.activation_compression = codec;
}

void swap_encoded_accum2(Config& c, const char* codec) {
  sgd(c);
  c.model.n_layer = 4;
  swapped(c, {2, 2});
  c.train.grad_accum = 2;
  c.memory.activation_compression = codec;
}

// memory.activation_policy = auto under swap (plan/swap_policy.h): four blocks, two micro-batches,
// a budget of the parameters and gradients resident and two blocks' activations of the four.
void swapped_activation_policy(Config& c) {
  c.model.n_layer = 4;
  swapped(c, {});
  c.memory.activation_policy = "auto";
  c.train.grad_accum = 2;
  const ParallelDims dims(c.parallel, 1, "row");
  const double keep = activation_options(c, dims, BlockCosts(), false)[0][0].bytes;
  double parameters = 0;
  for (const auto& item : *parameter_census(c.model)) parameters += static_cast<double>(item.meta.numel());
  c.memory.device_budget_gb = (8 * parameters + 2 * keep) / (1024.0 * 1024.0 * 1024.0);
}

const std::vector<Row>& layouts() {
  static const std::vector<Row> table = {
      {"swap_3_submodels_accum2", 1,
       [](Config& c) {
         c.model.n_layer = 4;
         swapped(c, {1, 2, 1});
         c.train.grad_accum = 2;
       },
       &kExact},
      {"swap_partitioned_moe_full_checkpointing_accum2", 1,
       [](Config& c) {
         c.model.n_layer = 4;
         c.model.ffn = "moe";
         c.model.moe_every = 1;  // every sub-model has experts, whose loss is a root of its own
         c.memory.activation_checkpointing = "full";
         swapped(c, {});
         c.train.grad_accum = 2;
       },
       &kExact},
      {"swap_linear_selective_checkpointing_adafactor", 1,
       [](Config& c) {
         c.model.arch = "linear";
         c.model.n_layer = 3;
         c.memory.activation_checkpointing = "selective";
         c.optim.name = "adafactor";
         swapped(c, {1, 1, 1});
       },
       &kExact},
      {"dp2_swap_accum2", 2,
       [](Config& c) {
         c.model.n_layer = 4;
         swapped(c, {1, 3});
         c.train.grad_accum = 2;
       }},
      // The activation policy chosen with the swap plan (its choice here: full, full, full, keep).
      {"swap_activation_policy_sgd_accum2", 1,
       [](Config& c) {
         sgd(c);
         swapped_activation_policy(c);
       },
       &kExact},
      {"swap_activation_policy_accum2", 1, [](Config& c) { swapped_activation_policy(c); }, &kExact},
      {"swap_bf16_fp32_copies_2_submodels", 1,
       [](Config& c) {
         c.model.n_layer = 4;
         c.precision.dtype = "bf16";
         swapped(c, {2, 2});
         c.memory.swap_copies = "fp32";
       },
       &kExact},
      // bf16 copies on the link: the device computes with the masters rounded to bf16 (autocast
      // rounds every matmul operand so anyway; norms and embeddings see the rounding too), so
      // near-zero gradients can change sign and Adam turns that into steps of up to 2 lr, as
      // under tensor parallelism: the bf16-under-tp bounds.
      {"swap_bf16_copies_2_submodels", 1,
       [](Config& c) {
         c.model.n_layer = 4;
         c.precision.dtype = "bf16";
         swapped(c, {2, 2});
       },
       &kBf16Sharded},
      {"swap_overlapped_updates_no_clipping_accum2", 1,
       [](Config& c) {
         c.model.n_layer = 4;
         c.optim.grad_clip = 0;  // every OPTIM overlaps the backward of earlier sub-models
         swapped(c, {2, 1, 1});
         c.train.grad_accum = 2;
       },
       &kExact},
      {"dp2", 2, [](Config& c) {}},
      {"llama_dp2_zero3_sgd", 2, [](Config& c) { llama(c); sgd(c); c.parallel.zero_stage = 3; }},
      {"llama_tp2_sgd", 2, [](Config& c) { llama(c); sgd(c); c.parallel.tp = 2; }},
      {"qwen3_dp2_tp2_zero1", 4, [](Config& c) { llama(c, true); c.parallel.tp = 2; c.parallel.zero_stage = 1; }},
      // Fewer key/value heads than tp ranks: each kv head replicated over tp / n_kv_head ranks.
      {"llama_tp4_kv2_sgd", 4, [](Config& c) { llama(c); sgd(c); c.parallel.tp = 4; }},
      {"llama_dp2_tp2_kv1_zero3", 4,
       [](Config& c) {
         llama(c);
         c.model.n_kv_head = 1;
         c.parallel.tp = 2;
         c.parallel.zero_stage = 3;
       }},
      {"llama_pp2_1f1b_sgd_accum2", 2,
       [](Config& c) {
         llama(c);
         sgd(c);
         c.parallel.pp = 2;
         c.train.grad_accum = 2;
       }},
      // Megatron-SP's sequence-gathered product of the joined query and key/value weights (with
      // biases on them alone, as Qwen 2 has; and none), its weight gradient split into their rows
      // (parallel/tensor/tp_comm.h).
      {"qwen3_qkv_bias_tp2_megatron_sp_sgd", 2,
       [](Config& c) {
         llama(c, true);
         sgd(c);
         c.model.bias = false;
         c.model.qkv_bias = true;
         c.parallel.tp = 2;
         c.parallel.megatron_sp = true;
       }},
      {"llama_pp2_tp2_megatron_sp_accum2", 4,
       [](Config& c) {
         llama(c);
         c.model.bias = false;
         c.parallel.pp = 2;
         c.parallel.tp = 2;
         c.parallel.megatron_sp = true;
         c.train.grad_accum = 2;
       }},
      {"llama_sp2_ring_sgd", 2, [](Config& c) { llama(c); sgd(c); c.parallel.sp = 2; c.parallel.sp_method = "ring"; }},
      {"qwen3_sp2_ulysses", 2, [](Config& c) { llama(c, true); c.parallel.sp = 2; c.parallel.sp_method = "ulysses"; }},
      {"mixtral_dp2_ep2_sgd", 2, [](Config& c) { mixtral(c); sgd(c); c.parallel.ep = 2; }},
      {"deepseek_dp2_tp2_ep2_zero1", 4,
       [](Config& c) {
         mixtral(c, true);
         c.parallel.tp = 2;
         c.parallel.ep = 2;
         c.parallel.zero_stage = 1;
       }},
      // Hierarchical dispatch (parallel.ep_dispatch): four ranks on two nodes of two, the groups
      // the nodes (a token reaches one node); dp2 x tp2 with each ep rank its own node (hop 1
      // only); capacity routing under ZeRO-3 and full recomputation on two nodes (both hops).
      {"deepseek_dp4_ep4_hierarchical_sgd", 4,
       [](Config& c) {
         mixtral(c, true);
         sgd(c);
         c.model.moe_groups = 2;
         c.model.moe_topk_groups = 1;
         c.parallel.ep = 4;
         c.parallel.ep_dispatch = "hierarchical";
         c.parallel.ranks_per_node = 2;
       }},
      {"mixtral_dp2_tp2_ep2_hierarchical_zero1", 4,
       [](Config& c) {
         mixtral(c);
         c.parallel.tp = 2;
         c.parallel.ep = 2;
         c.parallel.zero_stage = 1;
         c.parallel.ep_dispatch = "hierarchical";
         c.parallel.ranks_per_node = 1;
       }},
      {"dp4_ep4_moe_capacity_hierarchical_zero3_full_accum2", 4,
       [](Config& c) {
         c.model.ffn = "moe";
         c.model.moe_experts = 8;
         c.model.moe_top_k = 2;
         c.parallel.ep = 4;
         c.parallel.zero_stage = 3;
         c.parallel.ep_dispatch = "hierarchical";
         c.parallel.ranks_per_node = 2;
         c.memory.activation_checkpointing = "full";
         c.train.grad_accum = 2;
       }},
      // Qwen2-MoE's experts: q, k, v biases, raw top-2 softmax gates and a shared expert behind its
      // sigmoid gate, replicated over tp and ep like the shared MLP.
      {"qwen2moe_dp2_tp2_ep2_zero2_sgd", 4,
       [](Config& c) {
         mixtral(c);
         sgd(c);
         c.model.qkv_bias = true;
         c.model.moe_gates = "scores";
         c.model.moe_ffn_hidden = 24;
         c.model.moe_shared_experts = 2;
         c.model.moe_shared_gate = true;
         c.parallel.tp = 2;
         c.parallel.ep = 2;
         c.parallel.zero_stage = 2;
       }},
      // The same experts with AdamW, the dense first block and the gated shared expert on stage 0.
      {"qwen2moe_pp2_1f1b_accum2", 2,
       [](Config& c) {
         mixtral(c);
         c.model.qkv_bias = true;
         c.model.moe_gates = "scores";
         c.model.moe_ffn_hidden = 24;
         c.model.moe_shared_experts = 2;
         c.model.moe_shared_gate = true;
         c.model.moe_dense_layers = 1;
         c.parallel.pp = 2;
         c.train.grad_accum = 2;
       }},
      // ZB-V's split backward (I then W) and V placement (the untied head on rank 0) over Mixtral's
      // blocks: rotary GQA attention and SwiGLU experts in every block.
      {"mixtral_pp2_zbv_sgd_accum4", 2,
       [](Config& c) {
         mixtral(c);
         sgd(c);
         c.model.n_layer = 4;
         c.parallel.pp = 2;
         c.parallel.pp_schedule = "zbv";
         c.train.grad_accum = 4;
       }},
      {"deepseek_pp2_1f1b_sgd_accum2", 2,
       [](Config& c) {
         mixtral(c, true);
         sgd(c);
         c.parallel.pp = 2;
         c.train.grad_accum = 2;
       }},
      {"dp2_zero3_sgd", 2, [](Config& c) { sgd(c); c.parallel.zero_stage = 3; }},
      {"dp2_tp2_sgd", 4, [](Config& c) { sgd(c); c.parallel.tp = 2; }},
      {"pp2_1f1b_sgd_accum2", 2,
       [](Config& c) {
         sgd(c);
         c.parallel.pp = 2;
         c.train.grad_accum = 2;
       }},
      // The split backward (I then W) with SGD, under V placement, ZB-V's table built again for the
      // costs measured at step 2 (taken where the simulator finds it faster).
      {"pp2_zbv_sgd_accum4", 2,
       [](Config& c) {
         sgd(c);
         c.model.n_layer = 4;
         c.parallel.pp = 2;
         c.parallel.pp_schedule = "zbv";
         c.train.grad_accum = 4;
       }},
      // Whole backwards beside split ones (what ZB-H1's table built for costs with B cheaper than
      // I + W runs, schedule_builders.h; here B 1.8 against I + W 2): rank 0 runs every backward
      // whole, rank 1 1I0 1F1 1B1 1W0 ... As a file: table, so the row does not depend on this
      // machine's timings.
      {"pp2_zbh1_whole_backwards_sgd_accum4", 2,
       [](Config& c) {
         sgd(c);
         c.parallel.pp = 2;
         c.train.grad_accum = 4;
         pipeline::ActionCosts costs;
         costs.f = 1, costs.b = 1.8, costs.i = 1.2, costs.w = 0.8;
         const std::string path = test::fresh_dir("zbh1_whole_backwards") + "/table.csv";
         std::ofstream(path) << pipeline::to_csv(pipeline::build_schedule("zbh1", 2, 4, 1, costs));
         c.parallel.pp_schedule = "file:" + path;
       }},
      {"sp2_lasp_linear_sgd", 2,
       [](Config& c) {
         sgd(c);
         c.model.arch = "linear";
         c.parallel.sp = 2;
         c.parallel.sp_method = "lasp";
       }},
      {"swap_sgd_2_submodels_accum2", 1,
       [](Config& c) {
         sgd(c);
         c.model.n_layer = 4;
         swapped(c, {2, 2});
         c.train.grad_accum = 2;
       },
       &kExact},
      // Saved activations encoded (memory.activation_compression), the reference encoding the same
      // way: a group of 32 depends only on its own values (memory/activation_codec.h), so each
      // layout encodes every element as one process does. Under tp the row's width is 64, so that
      // a rank's half of a split last dimension (32) is whole groups.
      {"dp2_zero3_int8_activations_sgd", 2, [](Config& c) { dp2_zero3_encoded(c, "int8"); }},
      {"dp2_zero3_int4_activations_sgd", 2, [](Config& c) { dp2_zero3_encoded(c, "int4"); }},
      {"tp2_megatron_sp_int4_activations_sgd", 2, [](Config& c) { tp2_megatron_sp_encoded(c, "int4"); },
       &kInt4Sharded},
      {"pp2_zbv_int4_activations_sgd_accum4", 2, [](Config& c) { pp2_zbv_encoded_accum4(c, "int4"); },
       &kInt8Pipelined},
      {"tp2_megatron_sp_int8_activations_sgd", 2, [](Config& c) { tp2_megatron_sp_encoded(c, "int8"); },
       &kInt8Sharded},
      // The attention core's tensors at int8 beside the rest at int4 (memory.attention_compression):
      // the core is the same function of the same values in each layout (its heads split under tp,
      // its sequence under LASP).
      {"dp2_zero3_int4_attention_int8_activations_sgd", 2, core_at_int8(dp2_zero3_encoded)},
      {"tp2_megatron_sp_int4_attention_int8_activations_sgd", 2, core_at_int8(tp2_megatron_sp_encoded), &kInt4Sharded},
      {"pp2_zbv_int4_attention_int8_activations_sgd_accum4", 2, core_at_int8(pp2_zbv_encoded_accum4), &kInt8Pipelined},
      {"sp2_lasp_linear_int4_attention_int8_activations_sgd", 2, core_at_int8(sp2_lasp_encoded), &kInt4Sharded},
      {"pp2_zbv_int8_activations_sgd_accum4", 2, [](Config& c) { pp2_zbv_encoded_accum4(c, "int8"); },
       &kInt8Pipelined},
      {"sp2_lasp_linear_int8_activations_sgd", 2, [](Config& c) { sp2_lasp_encoded(c, "int8"); }, &kInt8Sharded},
      {"mixtral_dp2_ep2_int8_activations_sgd", 2, [](Config& c) { ep2_mixtral_encoded(c, "int8"); }},
      {"swap_int8_activations_sgd_2_submodels_accum2", 1, [](Config& c) { swap_encoded_accum2(c, "int8"); }, &kExact},
      {"mixtral_dp2_ep2_int4_attention_int8_activations_sgd", 2, core_at_int8(ep2_mixtral_encoded)},
      {"swap_int4_attention_int8_activations_sgd_2_submodels_accum2", 1, core_at_int8(swap_encoded_accum2), &kExact},
      {"peers2_batch_int4_attention_int8_activations_sgd", 2, core_at_int8(plain_encoded), &kFp32, false, true},
      // Codecs chosen per saved tensor (memory.activation_compression = adaptive): rank 0 probes its
      // first micro-batch, the reference's first, and both runs encode by the same table.
      {"dp2_adaptive_activations_sgd_accum2", 2,
       [](Config& c) {
         sgd(c);
         c.train.grad_accum = 2;
         adaptive_at_7_bits(c);
       }},
      {"dp2_zero2_adaptive_activations", 2,  // AdamW
       [](Config& c) {
         c.parallel.zero_stage = 2;
         adaptive_at_7_bits(c);
       }},
      // Under tp the two ranks probe together, their errors weighed and summed as the clipping
      // norm's squares (parallel/activation_probe.h).
      {"tp2_megatron_sp_adaptive_activations_sgd", 2,
       [](Config& c) {
         tp2_megatron_sp_encoded(c, "adaptive");
         c.memory.activation_bits = 7;
       },
       &kInt4Sharded},
      // Under sequence parallelism the sp group probes together, each rank on its chunk: parameter
      // gradients' differences summed over the group before their squares, the input's squares
      // summed; the table then broadcast over the dp ranks.
      {"sp2_lasp_linear_adaptive_activations_sgd", 2,
       [](Config& c) {
         sp2_lasp_encoded(c, "adaptive");
         c.memory.activation_bits = 7;
       },
       &kInt4Sharded},
      {"sp2_ulysses_adaptive_activations_sgd", 2,
       [](Config& c) {
         sgd(c);
         c.parallel.sp = 2;
         c.parallel.sp_method = "ulysses";
         adaptive_at_7_bits(c);
       },
       &kInt4Sharded},
      {"dp2_sp2_ring_adaptive_activations", 4,  // AdamW, softmax attention
       [](Config& c) {
         c.parallel.sp = 2;
         c.parallel.sp_method = "ring";
         adaptive_at_7_bits(c);
       },
       &kInt4Sharded},
      {"dp2_moe_adaptive_activations_sgd", 2,  // Switch-style MoE blocks, their experts stacked
       [](Config& c) {
         sgd(c);
         c.model.ffn = "moe";
         adaptive_at_7_bits(c);
       }},
      // The probe leaves the MoE layers' statistics as they were; under global balance every rank
      // probes (its counts summed over dp_sp as the step sums them).
      {"dp2_moe_global_aux_adaptive_activations_sgd", 2,  // every rank probes, as one merged micro-batch
       [](Config& c) {
         sgd(c);
         c.model.ffn = "moe";
         c.model.moe_top_k = 2;
         c.model.moe_capacity_factor = 0;  // dropless: the merged reference drops nothing either
         c.model.moe_aux_loss_coef = 0.1;
         c.model.moe_aux_scope = "global";
         adaptive_at_7_bits(c);
       },
       &kInt4AfterFirstStep, true},
      {"dp2_moe_aux_loss_free_adaptive_activations", 2,  // AdamW; the bias moves the routing of steps 2 and 3
       [](Config& c) {
         c.model.ffn = "moe";
         c.model.moe_top_k = 2;
         c.model.moe_aux_loss_coef = 0;
         c.model.moe_bias_update_rate = 0.05;
         adaptive_at_7_bits(c);
       }},
      {"dp2_moe_adaptive_activations", 2,  // AdamW
       [](Config& c) {
         c.model.ffn = "moe";
         adaptive_at_7_bits(c);
       }},
      {"tp2_sp2_ring_adaptive_activations_sgd", 4,  // errors summed over sp, then tp
       [](Config& c) {
         sgd(c);
         c.model.n_embd = 64;
         c.parallel.tp = 2;
         c.parallel.sp = 2;
         c.parallel.sp_method = "ring";
         adaptive_at_7_bits(c);
       },
       &kInt4Sharded},
      // With offload the probe's passes store and fetch their blocks' groups as a step does; the
      // reference keeps its activations (offload is lossless) and chooses the same table.
      {"dp2_adaptive_activation_offload_sgd", 2,
       [](Config& c) {
         sgd(c);
         adaptive_at_7_bits(c);
         c.memory.activation_offload = 2;
       }},
      {"dp2_adaptive_activation_offload", 2,  // AdamW
       [](Config& c) {
         adaptive_at_7_bits(c);
         c.memory.activation_offload = 2;
       }},
      {"dp2_tp2_adaptive_activations", 4,  // AdamW, tp without Megatron-SP
       [](Config& c) {
         c.model.n_embd = 64;
         c.parallel.tp = 2;
         adaptive_at_7_bits(c);
       },
       &kInt4Sharded},
      // Swapped, the probe loads each sub-model around its census passes and its blocks' passes.
      {"swap_adaptive_activations_sgd_2_submodels_accum2", 1,
       [](Config& c) {
         swap_encoded_accum2(c, "adaptive");
         c.memory.activation_bits = 7;
       },
       &kExact},
      {"dp2_swap_adaptive_activations_accum2", 2,  // AdamW; rank 0's table broadcast
       [](Config& c) {
         c.model.n_layer = 4;
         swapped(c, {1, 3});
         c.train.grad_accum = 2;
         adaptive_at_7_bits(c);
       },
       &kInt4AfterFirstStep},
      // Under ZeRO-3 every replica probes rank 0's micro-batch, one block gathered at a time.
      {"dp2_zero3_adaptive_activations_sgd_accum2", 2,
       [](Config& c) {
         sgd(c);
         c.parallel.zero_stage = 3;
         c.train.grad_accum = 2;
         adaptive_at_7_bits(c);
       }},
      {"dp2_zero3_offload_adaptive_activations", 2,  // AdamW, the optimizer state in host memory
       [](Config& c) {
         c.parallel.zero_stage = 3;
         c.parallel.offload = true;
         adaptive_at_7_bits(c);
       }},
      // Under expert parallelism the ep group probes its rank 0's micro-batch together, the
      // experts' gradients counted as ep copies of one process's (parallel/activation_probe.h).
      {"mixtral_dp2_ep2_adaptive_activations_sgd", 2,  // dropless top-2 SwiGLU experts
       [](Config& c) {
         ep2_mixtral_encoded(c, "adaptive");
         c.memory.activation_bits = 7;
       },
       &kInt4Sharded},
      {"dp4_ep2_moe_top2_adaptive_activations_accum2", 4,  // AdamW, capacity; the table broadcast over edp
       [](Config& c) {
         c.model.ffn = "moe";
         c.model.moe_top_k = 2;
         c.parallel.ep = 2;
         c.train.grad_accum = 2;
         adaptive_at_7_bits(c);
       },
       &kInt4Sharded},
      // Through a pipeline the census is micro-batch 0 through the stages and back, each rank
      // probes its stages' blocks, and the pp group chooses one table for the whole model.
      {"pp2_zbv_adaptive_activations_sgd_accum4", 2,  // two stages a rank
       [](Config& c) {
         pp2_zbv_encoded_accum4(c, "adaptive");
         c.memory.activation_bits = 7;
       },
       &kInt4AfterFirstStep},
      {"pp2_deepseek_adaptive_activations_sgd_accum2", 2,  // a dense block and MoE blocks: stages unalike
       [](Config& c) {
         sgd(c);
         mixtral(c, true);
         c.model.moe_bias_update_rate = 0;  // refused with adaptive codecs (config.cpp)
         c.parallel.pp = 2;
         c.train.grad_accum = 2;
         adaptive_at_7_bits(c);
       },
       &kInt4AfterFirstStep},
      {"dp2_pp2_adaptive_activations_sgd_accum2", 4,  // each stage's table broadcast over its replicas
       [](Config& c) {
         sgd(c);
         c.model.n_layer = 4;
         c.parallel.pp = 2;
         c.train.grad_accum = 2;
         adaptive_at_7_bits(c);
       },
       &kInt4AfterFirstStep},
      {"pp2_tp2_megatron_sp_adaptive_activations_accum2", 4,  // AdamW; the tp ranks of a stage probe together
       [](Config& c) {
         c.model.n_embd = 64;
         c.parallel.pp = 2;
         c.parallel.tp = 2;
         c.parallel.megatron_sp = true;
         c.train.grad_accum = 2;
         adaptive_at_7_bits(c);
       },
       &kInt4Sharded},
      {"dp2_bf16_int8_activations", 2,
       [](Config& c) {
         c.precision.dtype = "bf16";
         c.memory.activation_compression = "int8";
       },
       &kBf16},
      {"tp2_megatron_sp_int4_attention_int8_activations", 2,  // AdamW (the rows above are SGD's)
       [](Config& c) {
         c.model.n_embd = 64;
         c.parallel.tp = 2;
         c.parallel.megatron_sp = true;
         c.memory.activation_compression = "int4";
         c.memory.attention_compression = "int8";
       },
       &kInt4Sharded},
      {"peers2_batch_fp16_int8_activations_sgd", 2,  // fp16 runs on one process per replica: swarm peers
       [](Config& c) {
         sgd(c);
         c.precision.dtype = "fp16";
         c.precision.loss_scale_init = 256;
         c.memory.activation_compression = "int8";
       },
       &kFp16, false, true},
      {"dp2_fp8_activations_selective_checkpointing", 2,
       [](Config& c) {
         c.memory.activation_checkpointing = "selective";
         c.memory.activation_compression = "fp8";
       }},
      // Saved activations in host memory between forward and backward (memory.activation_offload):
      // lossless, so each layout matches one process that keeps them on the device, as it does
      // without offload.
      {"dp2_zero3_activation_offload_sgd", 2,
       [](Config& c) {
         sgd(c);
         c.parallel.zero_stage = 3;
         c.memory.activation_offload = 2;
       }},
      {"tp2_megatron_sp_activation_offload_sgd", 2,
       [](Config& c) {
         sgd(c);
         c.parallel.tp = 2;
         c.parallel.megatron_sp = true;
         c.memory.activation_offload = 1;
       }},
      {"pp2_zbv_activation_offload_sgd_accum4", 2,
       [](Config& c) {
         sgd(c);
         c.model.n_layer = 4;
         c.parallel.pp = 2;
         c.parallel.pp_schedule = "zbv";
         c.train.grad_accum = 4;
         c.memory.activation_offload = 4;
       }},
      {"pp2_1f1b_int8_activation_offload_sgd_accum4", 2,
       [](Config& c) {
         sgd(c);
         c.model.n_layer = 4;
         c.parallel.pp = 2;
         c.train.grad_accum = 4;
         c.memory.activation_compression = "int8";
         c.memory.activation_offload = 3;
       },
       &kInt8Pipelined},
      // A pipeline rank's held micro-batches beyond one wait in host memory
      // (memory.resident_micro_batches): 1F1B, a split backward (its I fetches, its W uses), and
      // interleaved stages (held in units of a stage), each with SGD and AdamW.
      {"pp2_1f1b_resident_micro_batches_sgd_accum4", 2, held_offload("1f1b", 1, true)},
      {"pp2_zbh1_resident_micro_batches_sgd_accum4", 2, held_offload("zbh1", 1, true)},
      {"pp2_interleaved_resident_micro_batches_accum4", 2, held_offload("interleaved", 2, false)},
      {"pp2_interleaved_resident_micro_batches_sgd_accum4", 2, held_offload("interleaved", 2, true)},
      {"pp2_1f1b_resident_micro_batches_accum4", 2, held_offload("1f1b", 1, false)},
      {"pp2_zbh1_resident_micro_batches_accum4", 2, held_offload("zbh1", 1, false)},
      {"sp2_lasp_linear_activation_offload_sgd", 2,
       [](Config& c) {
         sgd(c);
         c.model.arch = "linear";
         c.parallel.sp = 2;
         c.parallel.sp_method = "lasp";
         c.memory.activation_offload = 2;
       }},
      {"mixtral_dp2_ep2_activation_offload_sgd", 2,
       [](Config& c) {
         mixtral(c);
         sgd(c);
         c.parallel.ep = 2;
         c.memory.activation_offload = 1;
       }},
      {"swap_activation_offload_sgd_2_submodels_accum2", 1,
       [](Config& c) {
         sgd(c);
         c.model.n_layer = 4;
         swapped(c, {2, 2});
         c.train.grad_accum = 2;
         c.memory.activation_offload = 4;
       },
       &kExact},
      // The activation policy for a budget: every unencoded choice is exact, so each layout
      // matches one process that keeps its activations. Under the pipeline rank 0 holds two
      // micro-batches of its two blocks in three blocks' worth.
      {"pp2_1f1b_activation_policy_sgd_accum4", 2, [](Config& c) { pp2_activation_policy_sgd(c, "1f1b"); }},
      {"pp2_interleaved_activation_policy_sgd_accum4", 2,
       [](Config& c) { pp2_activation_policy_sgd(c, "interleaved"); }},
      // Zero-bubble schedules: a micro-batch awaiting its W counts what it keeps; with data
      // parallelism beside the pipeline, a block the policy recomputes fully reduces its gradients
      // inside I.
      {"pp2_zbv_activation_policy_sgd_accum4", 2, [](Config& c) { pp2_activation_policy_sgd(c, "zbv"); }},
      {"dp2_pp2_zbh1_activation_policy_accum2", 4,
       [](Config& c) {
         c.model.n_layer = 4;
         c.parallel.pp = 2;
         c.parallel.pp_schedule = "zbh1";
         c.train.grad_accum = 2;
         activation_policy(c, 4, 3);
       }},
      {"dp2_activation_offload_full_checkpointing", 2,
       [](Config& c) {
         c.memory.activation_checkpointing = "full";
         c.memory.activation_offload = 2;
       }},
      {"dp2_zero1_offload_sgd", 2,
       [](Config& c) {
         sgd(c);
         c.parallel.zero_stage = 1;
         c.parallel.offload = true;
       }},
      {"dp2_zero1", 2, [](Config& c) { c.parallel.zero_stage = 1; }},
      {"dp2_zero2_accum2", 2, [](Config& c) { c.parallel.zero_stage = 2; c.train.grad_accum = 2; }},
      {"dp4_zero3_full_checkpointing", 4,
       [](Config& c) { c.parallel.zero_stage = 3; c.memory.activation_checkpointing = "full"; }},
      {"dp2_zero3_offload", 2, [](Config& c) { c.parallel.zero_stage = 3; c.parallel.offload = true; }},
      {"dp1_zero1_offload", 1, [](Config& c) { c.parallel.zero_stage = 1; c.parallel.offload = true; }},
      {"dp2_moe", 2, [](Config& c) { c.model.ffn = "moe"; }},
      {"dp2_zero3_moe_accum2", 2,
       [](Config& c) {
         c.model.ffn = "moe";
         c.parallel.zero_stage = 3;
         c.train.grad_accum = 2;
       }},
      {"dp2_ep2_moe_top2_sgd", 2,
       [](Config& c) {
         sgd(c);
         c.model.ffn = "moe";
         c.model.moe_top_k = 2;
         c.parallel.ep = 2;
       }},
      {"dp4_ep4_moe_top4_of_8_dropless_zero1", 4,
       [](Config& c) {
         c.model.ffn = "moe";
         c.model.moe_experts = 8;
         c.model.moe_top_k = 4;
         c.model.moe_capacity_factor = 0;
         c.parallel.ep = 4;
         c.parallel.zero_stage = 1;
       }},
      {"dp4_ep2_moe_sigmoid_zero3_sgd_accum2", 4,
       [](Config& c) {
         sgd(c);
         c.model.ffn = "moe";
         c.model.moe_score = "sigmoid";
         c.model.moe_top_k = 2;
         c.parallel.ep = 2;
         c.parallel.zero_stage = 3;
         c.train.grad_accum = 2;
       }},
      {"dp2_ep2_moe_capacity_drops_zero2_full_checkpointing", 2,
       [](Config& c) {
         c.model.ffn = "moe";
         c.model.moe_capacity_factor = 0.5;  // half the choices cannot fit: the same ones drop
         c.parallel.ep = 2;
         c.parallel.zero_stage = 2;
         c.memory.activation_checkpointing = "full";
       }},
      {"dp4_ep2_moe_aux_loss_free_zero1", 4,
       [](Config& c) {
         c.model.ffn = "moe";
         c.model.moe_top_k = 2;
         c.model.moe_aux_loss_coef = 0;
         c.model.moe_bias_update_rate = 0.05;  // moves the routing of steps 2 and 3
         c.parallel.ep = 2;
         c.parallel.zero_stage = 1;
       }},
      {"dp2_ep2_tp2_moe_zero2", 4,
       [](Config& c) {
         c.model.ffn = "moe";
         c.model.moe_top_k = 2;
         c.parallel.tp = 2;
         c.parallel.ep = 2;
         c.parallel.zero_stage = 2;
       }},
      {"dp2_sp2_ep2_moe_dropless_ring", 4,
       [](Config& c) {
         c.model.ffn = "moe";
         c.model.moe_capacity_factor = 0;  // each chunk routes alone: equal to one process when nothing drops
         c.model.moe_aux_loss_coef = 0;    // and without the balance loss (a product of means over the chunk)
         c.parallel.sp = 2;
         c.parallel.sp_method = "ring";
         c.parallel.ep = 2;
       }},
#if TESSERA_ATOM
      {"peers2_batch", 2, [](Config& c) {}, &kFp32, false, true},
      {"peers2_batch_sgd_accum2", 2,
       [](Config& c) {
         sgd(c);
         c.train.grad_accum = 2;
       },
       &kFp32, false, true},
      // The robust rules with two honest peers: CenteredClip clips neither (their distances to the
      // median are equal) and a trimmed mean of two trims nothing, so both are the mean.
      {"peers2_batch_centered_clip_sgd", 2,
       [](Config& c) {
         sgd(c);
         c.swarm.aggregation = "centered_clip";
       },
       &kFp32, false, true},
      {"peers2_batch_trimmed_mean", 2, [](Config& c) { c.swarm.aggregation = "trimmed_mean"; }, &kFp32, false, true},
      // fp16 peers (each its own masters and loss scale; the scale low enough that no step overflows
      // in either run, so both take every step) against fp16 on one process
      {"peers2_batch_fp16_sgd", 2,
       [](Config& c) {
         sgd(c);
         c.precision.dtype = "fp16";
         c.precision.loss_scale_init = 256;
       },
       &kFp16, false, true},
      // Four peers: the mean goes round a ring (averaging_ring.cpp); the butterfly's sums beside it.
      {"peers4_batch_ring", 4, [](Config& c) {}, &kFp32, false, true},
      {"peers4_batch_ring_sgd", 4, sgd, &kFp32, false, true},
      {"peers4_batch_butterfly_sgd", 4,
       [](Config& c) {
         sgd(c);
         c.swarm.mean_all_reduce = "butterfly";
       },
       &kFp32, false, true},
      {"peers2_batch_swapped_accum2", 2,
       [](Config& c) {
         c.model.n_layer = 4;
         swapped(c, {1, 3});
         c.train.grad_accum = 2;
       },
       &kFp32, false, true},
#endif
      {"dp2_sp2_moe_global_aux_dropless_ulysses", 4,
       [](Config& c) {
         c.model.ffn = "moe";
         c.model.moe_capacity_factor = 0;
         c.model.moe_aux_loss_coef = 0.1;  // counted over both chunks and both replicas: as one process
         c.model.moe_aux_scope = "global";
         c.parallel.sp = 2;
         c.parallel.sp_method = "ulysses";
       },
       &kFp32, true},
      {"dp4_ep2_moe_global_aux_top2_zero1_sgd_accum2", 4,
       [](Config& c) {
         sgd(c);
         c.model.ffn = "moe";
         c.model.moe_top_k = 2;
         c.model.moe_capacity_factor = 0;
         c.model.moe_aux_loss_coef = 0.1;
         c.model.moe_aux_scope = "global";
         c.parallel.ep = 2;
         c.parallel.zero_stage = 1;
         c.train.grad_accum = 2;
       },
       &kFp32, true},
      {"dp2_pp2_ep2_moe_top2_1f1b_zero1_accum2", 4,
       [](Config& c) {
         c.model.ffn = "moe";
         c.model.moe_every = 1;  // every block: stage 0 has experts, whose loss is its own root
         c.model.moe_top_k = 2;
         c.parallel.pp = 2;
         c.parallel.ep = 2;
         c.parallel.zero_stage = 1;
         c.train.grad_accum = 2;
       }},
      {"dp4_pp2_ep2_moe_dropless_zbh1_zero3_sgd_accum2", 8,
       [](Config& c) {
         sgd(c);
         c.model.ffn = "moe";
         c.model.moe_every = 1;
         c.model.moe_capacity_factor = 0;
         c.parallel.pp = 2;
         c.parallel.ep = 2;
         c.parallel.pp_schedule = "zbh1";
         c.parallel.zero_stage = 3;
         c.train.grad_accum = 2;
       }},
      // Hierarchical dispatch under zero-bubble's split backward (each rank its own node: the hop
      // between nodes; the exchanges' backward runs in I).
      {"dp2_pp2_ep2_moe_hierarchical_zbh1_sgd_accum2", 4,
       [](Config& c) {
         sgd(c);
         c.model.ffn = "moe";
         c.model.moe_every = 1;
         c.model.moe_top_k = 2;
         c.parallel.pp = 2;
         c.parallel.ep = 2;
         c.parallel.pp_schedule = "zbh1";
         c.parallel.ep_dispatch = "hierarchical";
         c.parallel.ranks_per_node = 1;
         c.train.grad_accum = 2;
       }},
      {"dp2_fp16_compression", 2, [](Config& c) { c.parallel.grad_compression = "fp16"; }, &kFp16Compressed},
      {"dp2_adafactor", 2, [](Config& c) { c.optim.name = "adafactor"; }},
      {"dp2_linear_selective_checkpointing", 2,
       [](Config& c) { c.model.arch = "linear"; c.memory.activation_checkpointing = "selective"; }},
      {"tp2", 2, [](Config& c) { c.parallel.tp = 2; }},
      {"tp2_megatron_sp_linear", 2,
       [](Config& c) { c.model.arch = "linear"; c.parallel.tp = 2; c.parallel.megatron_sp = true; }},
      {"dp2_tp2_zero3_megatron_sp", 4,
       [](Config& c) { c.parallel.tp = 2; c.parallel.megatron_sp = true; c.parallel.zero_stage = 3; }},
      // The tp gradient shares summed once a step (gradient_shares.h): after two micro-batches'
      // accumulation and DDP's bucketed all-reduce; after ZeRO-1's reduction and before its
      // buckets go to the host (offload).
      {"dp2_tp2_megatron_sp_sgd_accum2", 4,
       [](Config& c) {
         sgd(c);
         c.parallel.tp = 2;
         c.parallel.megatron_sp = true;
         c.train.grad_accum = 2;
       }},
      {"dp2_tp2_zero1_offload_megatron_sp_accum2", 4,
       [](Config& c) {
         c.parallel.tp = 2;
         c.parallel.megatron_sp = true;
         c.parallel.zero_stage = 1;
         c.parallel.offload = true;
         c.train.grad_accum = 2;
       }},
      {"tp4_megatron_sp_full_checkpointing", 4,
       [](Config& c) {
         c.parallel.tp = 4;
         c.parallel.megatron_sp = true;
         c.memory.activation_checkpointing = "full";
       }},
      {"tp2_linear_selective_checkpointing", 2,
       [](Config& c) { c.model.arch = "linear"; c.parallel.tp = 2; c.memory.activation_checkpointing = "selective"; }},
      {"sp2_ring", 2, [](Config& c) { c.parallel.sp = 2; c.parallel.sp_method = "ring"; }},
      {"sp2_ulysses", 2, [](Config& c) { c.parallel.sp = 2; c.parallel.sp_method = "ulysses"; }},
      {"sp4_ring_selective_checkpointing", 4,
       [](Config& c) {
         c.parallel.sp = 4;
         c.parallel.sp_method = "ring";
         c.memory.activation_checkpointing = "selective";
       }},
      {"sp4_ulysses_selective_checkpointing", 4,
       [](Config& c) {
         c.parallel.sp = 4;
         c.parallel.sp_method = "ulysses";
         c.memory.activation_checkpointing = "selective";
       }},
      {"sp2_lasp_linear", 2, [](Config& c) { c.model.arch = "linear"; c.parallel.sp = 2; c.parallel.sp_method = "lasp"; }},
      {"sp4_lasp2_linear_zero3", 4,
       [](Config& c) {
         c.model.arch = "linear";
         c.parallel.sp = 4;
         c.parallel.sp_method = "lasp2";
         c.parallel.zero_stage = 3;
       }},
      {"dp2_sp2_ring_zero1", 4, [](Config& c) { c.parallel.sp = 2; c.parallel.zero_stage = 1; }},
      {"dp2_sp2_lasp2_linear_zero2", 4,
       [](Config& c) {
         c.model.arch = "linear";
         c.parallel.sp = 2;
         c.parallel.sp_method = "lasp2";
         c.parallel.zero_stage = 2;
       }},
      {"dp2_tp2_sp2_ring_zero1", 8,
       [](Config& c) { c.parallel.tp = 2; c.parallel.sp = 2; c.parallel.zero_stage = 1; }},
      {"dp2_tp2_sp2_lasp_linear_zero1", 8,
       [](Config& c) {
         c.model.arch = "linear";
         c.parallel.tp = 2;
         c.parallel.sp = 2;
         c.parallel.zero_stage = 1;
       }},
      {"pp2_gpipe_accum4", 2,
       [](Config& c) { c.parallel.pp = 2; c.parallel.pp_schedule = "gpipe"; c.train.grad_accum = 4; }},
      {"pp2_1f1b_accum4_full_checkpointing", 2,
       [](Config& c) {
         c.parallel.pp = 2;
         c.train.grad_accum = 4;
         c.memory.activation_checkpointing = "full";
       }},
      {"pp4_zbh1_accum4", 4,
       [](Config& c) {
         c.model.n_layer = 4;
         c.parallel.pp = 4;
         c.parallel.pp_schedule = "zbh1";
         c.train.grad_accum = 4;
       }},
      {"pp2_zbh1_accum2_full_checkpointing", 2,
       [](Config& c) {
         c.parallel.pp = 2;
         c.parallel.pp_schedule = "zbh1";
         c.train.grad_accum = 2;
         c.memory.activation_checkpointing = "full";
       }},
      {"pp2_zbh1_linear_accum2_selective_checkpointing", 2,
       [](Config& c) {
         c.model.arch = "linear";
         c.parallel.pp = 2;
         c.parallel.pp_schedule = "zbh1";
         c.train.grad_accum = 2;
         c.memory.activation_checkpointing = "selective";
       }},
      {"pp2_interleaved_v2_accum2", 2,
       [](Config& c) {
         c.model.n_layer = 4;
         c.parallel.pp = 2;
         c.parallel.pp_schedule = "interleaved";
         c.train.grad_accum = 2;
       }},
      {"pp4_interleaved_v2_accum4_uneven", 4,
       [](Config& c) {
         c.model.n_layer = 10;  // 8 stages of 2, 2, 1, ... blocks
         c.parallel.pp = 4;
         c.parallel.pp_schedule = "interleaved";
         c.train.grad_accum = 4;
       }},
      {"pp2_zbv_accum4", 2,
       [](Config& c) {
         c.model.n_layer = 4;
         c.parallel.pp = 2;
         c.parallel.pp_schedule = "zbv";
         c.train.grad_accum = 4;
       }},
      {"dp2_pp2_zbv_zero2_accum2", 4,
       [](Config& c) {
         c.model.n_layer = 4;
         c.parallel.pp = 2;
         c.parallel.pp_schedule = "zbv";
         c.parallel.zero_stage = 2;
         c.train.grad_accum = 2;
       }},
      {"pp2_dualpipev_accum4", 2,
       [](Config& c) {
         c.model.n_layer = 4;
         c.parallel.pp = 2;
         c.parallel.pp_schedule = "dualpipev";
         c.train.grad_accum = 4;
       }},
      {"pp2_dualpipev_tp2_megatron_sp_accum4_full_checkpointing", 4,
       [](Config& c) {
         c.model.n_layer = 4;
         c.parallel.pp = 2;
         c.parallel.tp = 2;
         c.parallel.megatron_sp = true;
         c.parallel.pp_schedule = "dualpipev";
         c.train.grad_accum = 4;
         c.memory.activation_checkpointing = "full";
       }},
      {"pp4_gpipe_accum8", 4,
       [](Config& c) {
         c.model.n_layer = 4;
         c.parallel.pp = 4;
         c.parallel.pp_schedule = "gpipe";
         c.train.grad_accum = 8;
       }},
      {"pp4_zbv_accum4", 4,
       [](Config& c) {
         c.model.n_layer = 8;
         c.parallel.pp = 4;
         c.parallel.pp_schedule = "zbv";
         c.train.grad_accum = 4;
       }},
      {"pp4_dualpipev_accum8_adafactor", 4,
       [](Config& c) {
         c.model.n_layer = 8;
         c.parallel.pp = 4;
         c.parallel.pp_schedule = "dualpipev";
         c.train.grad_accum = 8;
         c.optim.name = "adafactor";
       }},
      {"pp2_moe_1f1b_accum2", 2,
       [](Config& c) {
         c.model.ffn = "moe";
         c.model.moe_every = 1;  // every block: stage 0 has experts, whose loss is its own root
         c.parallel.pp = 2;
         c.train.grad_accum = 2;
       }},
      {"dp2_pp2_moe_zbh1_zero2_accum2", 4,
       [](Config& c) {
         c.model.ffn = "moe";
         c.model.moe_every = 1;  // every block: stage 0 has experts, whose loss is its own root
         c.parallel.pp = 2;
         c.parallel.pp_schedule = "zbh1";
         c.parallel.zero_stage = 2;
         c.train.grad_accum = 2;
       }},
      {"pp2_zbh1_hand_cut_3_1_accum2", 2,
       [](Config& c) {
         c.model.n_layer = 4;
         c.parallel.pp = 2;
         c.parallel.pp_schedule = "zbh1";
         c.parallel.pp_layers = {3, 1};
         c.train.grad_accum = 2;
       }},
      {"pp4_1f1b_uneven_accum2", 4,
       [](Config& c) {
         c.model.n_layer = 6;  // stages of 2, 2, 1, 1 blocks
         c.parallel.pp = 4;
         c.train.grad_accum = 2;
       }},
      {"dp2_pp2_1f1b_accum2", 4,
       [](Config& c) { c.parallel.pp = 2; c.train.grad_accum = 2; }},
      {"dp2_pp2_zbh1_zero1_accum4", 4,
       [](Config& c) {
         c.parallel.pp = 2;
         c.parallel.pp_schedule = "zbh1";
         c.parallel.zero_stage = 1;
         c.train.grad_accum = 4;
       }},
      {"dp2_pp2_zbh1_zero3_accum4", 4,
       [](Config& c) {
         c.parallel.pp = 2;
         c.parallel.pp_schedule = "zbh1";
         c.parallel.zero_stage = 3;
         c.train.grad_accum = 4;
       }},
      {"dp2_pp2_zbh1_zero3_reshard_per_microbatch_accum4", 4,
       [](Config& c) {
         c.parallel.pp = 2;
         c.parallel.pp_schedule = "zbh1";
         c.parallel.zero_stage = 3;
         c.parallel.zero3_reshard_per_microbatch = true;
         c.train.grad_accum = 4;
       }},
      {"dp2_pp2_zbv_zero3_reshard_per_microbatch_full_checkpointing_accum2", 4,
       [](Config& c) {
         c.model.n_layer = 4;
         c.parallel.pp = 2;
         c.parallel.pp_schedule = "zbv";
         c.parallel.zero_stage = 3;
         c.parallel.zero3_reshard_per_microbatch = true;
         c.memory.activation_checkpointing = "full";
         c.train.grad_accum = 2;
       }},
      {"dp2_pp2_zbh1_zero1_full_checkpointing_accum2", 4,
       [](Config& c) {
         c.parallel.pp = 2;
         c.parallel.pp_schedule = "zbh1";
         c.parallel.zero_stage = 1;
         c.memory.activation_checkpointing = "full";
         c.train.grad_accum = 2;
       }},
      {"dp2_pp2_interleaved_zero2_offload_accum2", 4,
       [](Config& c) {
         c.model.n_layer = 4;
         c.parallel.pp = 2;
         c.parallel.pp_schedule = "interleaved";
         c.parallel.zero_stage = 2;
         c.parallel.offload = true;
         c.train.grad_accum = 2;
       }},
      {"pp2_1f1b_profile_cut_accum2", 2,
       [](Config& c) {
         c.model.n_layer = 4;
         c.parallel.pp = 2;
         c.parallel.pp_cut = "profile";
         c.train.grad_accum = 2;
       }},
      {"dp2_pp2_zbv_tp2_zero3_accum2", 8,
       [](Config& c) {
         c.model.n_layer = 4;
         c.parallel.pp = 2;
         c.parallel.tp = 2;
         c.parallel.pp_schedule = "zbv";
         c.parallel.zero_stage = 3;
         c.train.grad_accum = 2;
       }},
      {"dp2_pp2_1f1b_zero1_offload_accum2", 4,
       [](Config& c) {
         c.parallel.pp = 2;
         c.parallel.zero_stage = 1;
         c.parallel.offload = true;
         c.train.grad_accum = 2;
       }},
      {"pp2_zbh1_zero3_offload_accum2", 2,
       [](Config& c) {
         c.parallel.pp = 2;
         c.parallel.pp_schedule = "zbh1";
         c.parallel.zero_stage = 3;
         c.parallel.offload = true;
         c.train.grad_accum = 2;
       }},
      {"dp2_pp2_gpipe_zero2_accum2_uneven", 4,
       [](Config& c) {
         c.model.n_layer = 3;  // stages of 2 and 1 blocks
         c.parallel.pp = 2;
         c.parallel.pp_schedule = "gpipe";
         c.parallel.zero_stage = 2;
         c.train.grad_accum = 2;
       }},
      {"pp2_tp2_1f1b_accum2", 4,
       [](Config& c) { c.parallel.pp = 2; c.parallel.tp = 2; c.train.grad_accum = 2; }},
      {"pp2_tp2_megatron_sp_zbh1_accum4", 4,
       [](Config& c) {
         c.parallel.pp = 2;
         c.parallel.tp = 2;
         c.parallel.megatron_sp = true;
         c.parallel.pp_schedule = "zbh1";
         c.train.grad_accum = 4;
       }},
      {"dp2_pp2_tp2_megatron_sp_zero2_accum2", 8,
       [](Config& c) {
         c.parallel.pp = 2;
         c.parallel.tp = 2;
         c.parallel.megatron_sp = true;
         c.parallel.zero_stage = 2;
         c.train.grad_accum = 2;
       }},
      {"pp2_sp2_lasp_linear_zbh1_accum2", 4,
       [](Config& c) {
         c.model.arch = "linear";
         c.parallel.pp = 2;
         c.parallel.sp = 2;
         c.parallel.sp_method = "lasp";
         c.parallel.pp_schedule = "zbh1";
         c.train.grad_accum = 2;
       }},
      {"pp2_sp2_ring_zero1_accum2", 4,
       [](Config& c) {
         c.parallel.pp = 2;
         c.parallel.sp = 2;
         c.parallel.sp_method = "ring";
         c.parallel.zero_stage = 1;
         c.train.grad_accum = 2;
       }},
      {"dp2_bf16", 2, [](Config& c) { c.precision.dtype = "bf16"; }, &kBf16},
      // ZeRO-3 under bf16: each product keeps the gathered float32 weights and casts them again in
      // its backward (model/linear.h, KeepFloatWeightsForBackward), after the weights were freed
      // and gathered again. Each rank's rows meet the same bf16 products as one process's, so the
      // float32 bounds hold (measured 1.2e-7 of max |g|); a backward that cast weights 1% off
      // moved the gradients by 2.8e-2, inside kBf16's bounds.
      {"dp2_zero3_bf16_sgd_accum2", 2,
       [](Config& c) {
         sgd(c);
         c.parallel.zero_stage = 3;
         c.train.grad_accum = 2;
         c.precision.dtype = "bf16";
       }},
      {"dp2_zero3_bf16", 2, [](Config& c) {
         c.parallel.zero_stage = 3;
         c.precision.dtype = "bf16";
       }},
      {"pp2_zbh1_bf16_accum2", 2,
       [](Config& c) {
         c.parallel.pp = 2;
         c.parallel.pp_schedule = "zbh1";
         c.parallel.pp_transfer_dtype = "float32";
         c.train.grad_accum = 2;
         c.precision.dtype = "bf16";
       },
       &kBf16},
      // The default wire: activations and their gradients cross the stage boundary in bf16.
      {"pp2_zbh1_bf16_wire_accum2", 2,
       [](Config& c) {
         c.parallel.pp = 2;
         c.parallel.pp_schedule = "zbh1";
         c.train.grad_accum = 2;
         c.precision.dtype = "bf16";
       },
       &kBf16Sharded},
      {"dp2_ep2_moe_top2_dropless_bf16", 2,
       [](Config& c) {
         c.model.ffn = "moe";
         c.model.moe_top_k = 2;
         c.model.moe_capacity_factor = 0;
         c.parallel.ep = 2;
         c.precision.dtype = "bf16";
       },
       &kBf16Sharded},  // an ep rank runs each expert on two ranks' rows at once (another bf16 kernel
                        // and rounding than one process's per micro-batch): Adam's sign flips, as under tp
      // The same under hierarchical dispatch on one node: the gates travel in the rows' bf16 and
      // are applied where the experts run.
      {"dp2_ep2_moe_top2_dropless_hierarchical_bf16", 2,
       [](Config& c) {
         c.model.ffn = "moe";
         c.model.moe_top_k = 2;
         c.model.moe_capacity_factor = 0;
         c.parallel.ep = 2;
         c.parallel.ep_dispatch = "hierarchical";
         c.parallel.ranks_per_node = 2;
         c.precision.dtype = "bf16";
       },
       &kBf16Sharded},
      {"tp2_megatron_sp_bf16", 2,
       [](Config& c) {
         c.parallel.tp = 2;
         c.parallel.megatron_sp = true;
         c.precision.dtype = "bf16";
       },
       &kBf16Sharded},
  };
  return table;
}

Batch global_batch(int64_t step) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(100 + static_cast<uint64_t>(step));
  const at::Tensor tokens = at::randint(64, {kRows, kSeqLen + 1}, gen, at::kLong);
  return {tokens.narrow(1, 0, kSeqLen).contiguous(), tokens.narrow(1, 1, kSeqLen).contiguous()};
}

struct Trace {
  std::vector<StepResult> steps;
  std::vector<std::map<std::string, at::Tensor>> gradients;  // per step
  std::map<std::string, at::Tensor> parameters;              // after the last step
};

// Step s's micro-batches of dp rank r of D with M micro-batches each: [(m D + r) B, ...) for m < M,
// B = kRows / (D M).
std::vector<Batch> rank_micro_batches(int64_t s, int64_t M, int64_t D, int64_t r) {
  const Batch batch = global_batch(s);
  const int64_t B = kRows / (D * M);
  std::vector<Batch> micro;
  for (int64_t m = 0; m < M; ++m) {
    const int64_t first = (m * D + r) * B;
    micro.push_back({batch.inputs.narrow(0, first, B), batch.targets.narrow(0, first, B)});
  }
  return micro;
}

// An observer that keeps a float32 copy of every gradient in `into`.
TrainStep::GradientObserver capture(std::map<std::string, at::Tensor>& into) {
  return [&into](const NamedTensors& g) {
    for (const auto& [name, t] : g) into[name] = t.to(at::kFloat).clone();
  };
}

// kSteps steps of `config` over `mesh`, whose dp rank r runs micro-batches [(m D + r) B, ...) for
// m < M; or, without a mesh, one process running all D M of those micro-batches (`split`: D M).
Trace train(const Config& config, comm::Mesh* mesh, int64_t split) {
  TrainStep step(config, mesh);
  const int64_t D = mesh ? mesh->dims().dp() : 1, r = mesh ? mesh->coord().dp : 0;
  const int64_t M = mesh ? config.train.grad_accum : split;
  Trace run;
  for (int64_t s = 0; s < kSteps; ++s) {
    std::map<std::string, at::Tensor> grads;
    run.steps.push_back(step.run(rank_micro_batches(s, M, D, r), config.optim.lr, capture(grads)));
    run.gradients.push_back(std::move(grads));
  }
  for (const auto& [name, t] : step.model_state()) run.parameters[name] = t.to(at::kFloat);
  return run;
}

#if TESSERA_ATOM
// kSteps steps of ATOM peers, one per rank of `mesh` (which only carries the peers' addresses and
// the mean of their losses): rank r, one process with its own model, runs the micro-batches dp rank
// r of a dp = world mesh would, and the swarm (batch mode, target: the global batch) averages.
// Every local step must end in a round (the peers wait for each other's claimed samples).
Trace train_peers(const Config& row, comm::Mesh& mesh) {
  const int64_t D = mesh.world_size(), r = mesh.rank(), M = row.train.grad_accum, B = kRows / (D * M);
  Config config = row;
  config.parallel = ParallelOptions();
  config.train.batch_size = B;  // what a peer's record claims for its next local step
  const std::string dir = test::fresh_dir("peers_key");
  std::ofstream(dir + "/key") << std::string(64, 'a') << "\n";
  config.swarm.key_file = dir + "/key";
  config.swarm.target_batch_size = kRows;
  config.swarm.min_peers = D;
  config.swarm.publish_interval_s = 0.05;
  config.swarm.record_ttl_s = 10;
  config.swarm.round_timeout_min_s = 2;
  config.swarm.round_timeout_max_s = 60;
  // Rank 0's swarm first: the others start from its address.
  at::Tensor port = at::zeros({1}, at::kLong);
  std::unique_ptr<atom::Swarm> swarm;
  auto make = [&](std::vector<std::string> initial) {
    char id[33];
    std::snprintf(id, sizeof(id), "%032lld", static_cast<long long>(r));
    swarm = std::make_unique<atom::Swarm>(atom::PeerIdentity{"harness", id, "127.0.0.1:0", std::move(initial), dir}, config);
  };
  if (r == 0) {
    make({});
    port[0] = std::stoll(swarm->address().substr(swarm->address().rfind(':') + 1));
  }
  mesh.world().broadcast(port, 0);
  if (r != 0) make({"127.0.0.1:" + std::to_string(port[0].item<int64_t>())});
  TrainStep step(config, nullptr);
  swarm->attach(step, 0, nullptr, {});
  Trace run;
  for (int64_t s = 0; s < kSteps; ++s) {
    std::map<std::string, at::Tensor> grads;
    StepResult result = step.run(rank_micro_batches(s, M, D, r), config.optim.lr, capture(grads));
    for (const std::string& line : swarm->take_messages()) std::printf("rank %lld %s\n", static_cast<long long>(r), line.c_str());
    EXPECT_TRUE(result.applied) << "peer " << r << ": local step " << s << " ended without a round";
    at::Tensor losses = at::tensor({result.ce_loss, result.aux_loss}, at::kDouble);
    mesh.world().all_reduce(losses, comm::ReduceOp::avg);
    result.ce_loss = losses[0].item<double>();
    result.aux_loss = losses[1].item<double>();
    run.steps.push_back(result);
    run.gradients.push_back(std::move(grads));
  }
  // Each round after the first started with its local step (swarm.overlap_rounds = always), where the
  // backward makes the gradients final (not under fp16 or swap: GradientHolder::gradient_leaves).
  const bool overlaps = config.precision.dtype != "fp16" && !config.memory.swap;
  EXPECT_EQ(swarm->metrics()["overlapped_rounds"].get<int64_t>(), overlaps ? kSteps - 1 : 0) << "peer " << r;
  // Three or more peers sum the mean of dense float32 round a ring (swarm.mean_all_reduce), two the butterfly.
  const bool ring = D >= 3 && config.swarm.mean_all_reduce == "ring" && config.swarm.aggregation == "mean";
  EXPECT_EQ(swarm->metrics()["ring_rounds"].get<int64_t>(), ring ? kSteps : 0) << "peer " << r;
  for (const auto& [name, t] : step.model_state()) run.parameters[name] = t.to(at::kFloat);
  mesh.world().barrier();  // no peer leaves while another may still be in a round
  swarm->leave();
  return run;
}
#else
Trace train_peers(const Config&, comm::Mesh&) { throw std::logic_error("no peers rows without TESSERA_ATOM"); }
#endif

class Equivalence : public ::testing::TestWithParam<Row> {};

TEST_P(Equivalence, MatchesOneProcess) {
  const Row& layout = GetParam();
  if (layout.peers && !TESSERA_ATOM) GTEST_SKIP() << "built with -DTESSERA_ATOM=OFF: no swarm to run peers rows on";
  test::Ranks ranks(layout.ranks);
  if (!ranks.is_worker()) {
    ranks.expect_success();
    std::istringstream lines(ranks.results().at(0).output);  // rank 0's "measured:" line, shown here
    for (std::string line; std::getline(lines, line);)
      if (line.rfind("measured:", 0) == 0) std::printf("%s\n", line.c_str());
    return;
  }
  Config config = base();
  layout.set(config);
  const ParallelDims dims(config.parallel, layout.ranks, layout.name);
  ASSERT_EQ(kRows % (dims.dp() * config.train.grad_accum), 0) << layout.name;
  auto mesh = comm::Mesh::connect(ranks.launch(), dims, config.parallel, c10::Device(at::kCPU));
  reset_activation_offload_stats();
  const Trace parallel = layout.peers ? train_peers(config, *mesh) : train(config, mesh.get(), 0);
  if (ranks.rank() != 0) return;
  if (config.memory.activation_offload > 0 || config.memory.resident_micro_batches > 0) {
    EXPECT_GT(activation_offload_stats().groups, 0) << layout.name << ": no block's activations went to the host";
  }

  Config single = config;
  single.parallel = ParallelOptions();
  single.memory.swap = false;  // swapping is a layout too: the reference trains resident
  single.memory.device_budget_gb = 0;
  single.memory.swap_blocks.clear();
  single.memory.activation_offload = 0;  // lossless: the reference keeps its activations on the device
  single.memory.activation_policy = "manual";
  const Trace reference =
      train(single, nullptr, layout.merged_reference ? config.train.grad_accum : dims.dp() * config.train.grad_accum);
  const Tolerance& tol = *layout.tolerance;
  double loss = 0, norm = 0, first = 0, grad = 0, param = 0;  // worst errors, measured as compared
  ASSERT_EQ(parallel.steps.size(), static_cast<size_t>(kSteps)) << layout.name << ": steps run";
  ASSERT_EQ(reference.steps.size(), static_cast<size_t>(kSteps)) << layout.name << ": reference steps run";
  ASSERT_EQ(parallel.gradients.size(), reference.gradients.size()) << layout.name << ": steps with gradients";
  for (int64_t s = 0; s < kSteps; ++s) {
    const StepResult &got = parallel.steps[s], &want = reference.steps[s];
    EXPECT_EQ(got.skipped, want.skipped) << layout.name << " step " << s << ": update skipped";
    EXPECT_EQ(got.applied, want.applied) << layout.name << " step " << s << ": update applied";
    loss = std::max(loss, std::abs(got.ce_loss - want.ce_loss) / std::abs(want.ce_loss));
    norm = std::max(norm, std::abs(got.grad_norm - want.grad_norm) / std::abs(want.grad_norm));
    EXPECT_NEAR(got.ce_loss, want.ce_loss, tol.loss_rtol * std::abs(want.ce_loss)) << layout.name << " step " << s;
    EXPECT_NEAR(got.aux_loss, want.aux_loss, tol.loss_rtol * std::abs(want.aux_loss) + 1e-7) << layout.name;
    EXPECT_NEAR(got.grad_norm, want.grad_norm, tol.norm_rtol * want.grad_norm) << layout.name << " step " << s;
    ASSERT_EQ(parallel.gradients[s].size(), reference.gradients[s].size()) << layout.name;
    for (const auto& [name, g_ref] : reference.gradients[s]) {
      ASSERT_TRUE(parallel.gradients[s].count(name)) << layout.name << ": no gradient of " << name;
      const at::Tensor& g = parallel.gradients[s].at(name);
      ASSERT_EQ(g.sizes(), g_ref.sizes()) << layout.name << " " << name;
      const double scale = std::max(g_ref.abs().max().item<double>(), 1e-12);
      grad = std::max(grad, (g - g_ref).abs().max().item<double>() / scale);
      const double atol = s == 0 ? tol.grad_atol_first : tol.grad_atol_later;
      if (s == 0) first = std::max(first, (g - g_ref).abs().max().item<double>() / scale);
      EXPECT_TRUE(test::all_close(g, g_ref, tol.grad_rtol, atol * scale))
          << layout.name << " step " << s << ": gradient of " << name;
    }
  }
  ASSERT_EQ(parallel.parameters.size(), reference.parameters.size());
  for (const auto& [name, p_ref] : reference.parameters) {
    const at::Tensor& p = parallel.parameters.at(name);
    param = std::max(param, (p - p_ref).abs().max().item<double>());
    EXPECT_TRUE(test::all_close(p, p_ref, tol.param_rtol, tol.param_atol)) << layout.name << ": parameter " << name;
  }
  std::printf("measured: %s loss %.1e grad_norm %.1e gradients %.1e first step, %.1e all (of max |g|), "
              "parameters %.1e (abs)\n", layout.name.c_str(), loss, norm, first, grad, param);
}

INSTANTIATE_TEST_SUITE_P(Layouts, Equivalence, ::testing::ValuesIn(layouts()),
                         [](const ::testing::TestParamInfo<Row>& info) { return info.param.name; });

}  // namespace
}  // namespace tessera
