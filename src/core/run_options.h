// Options of the run itself: the [train], [eval], [checkpoint] and [memory] sections (their checks:
// config/config.cpp, with the rest of the config's loading).
#pragma once

#include <cstdint>
#include <string>
#include <vector>
#include "core/error.h"
#include "core/options.h"

namespace tessera {

struct TrainOptions {
  int64_t steps = 1000;
  int64_t batch_size = 16;   // sequences per micro-batch
  int64_t seq_len = 128;     // tokens per sequence (<= model.block_size)
  int64_t grad_accum = 1;    // micro-batches per optimizer step
  int64_t global_batch_size = 0;  // sequences per optimizer step over all ranks; 0 = batch_size x dp x grad_accum
  int64_t log_every = 10;
  int64_t seed = 1337;       // model initialisation and dropout
  int64_t threads = 0;       // intra-op threads; 0 = all cores
  std::string device = "cpu";
  double peak_tflops = 0;    // for MFU; 0 = the device's known peak, or on CPU a measured matmul rate
  double time_limit = 0;     // wall seconds before the run checkpoints and stops (0 = none)
  int64_t trace_step = 0;    // pp > 1 or swap: the step whose timeline is written (0 = none)
  bool tensorboard = true;   // RUN_DIR/events.out.tfevents.tessera beside metrics.jsonl
  std::string plan_cluster;  // a cluster file or preset: the planner's prediction checked against the run ("" = none)

  template <class V>
  void visit(V& v) {
    v("steps", steps, "optimizer steps to train for", between(1, 1e12));
    v("batch_size", batch_size, "sequences per micro-batch", between(1, 1 << 20));
    v("seq_len", seq_len, "tokens per sequence (at most model.block_size)", between(1, 1 << 25));
    v("grad_accum", grad_accum, "micro-batches accumulated per optimizer step", between(1, 1 << 20));
    v("global_batch_size", global_batch_size,
      "sequences per optimizer step over all ranks; when set, grad_accum is derived as global / (batch_size x dp) "
      "(0 = batch_size x dp x grad_accum)",
      between(0, 1 << 24));
    v("log_every", log_every, "steps between metrics lines and progress updates", between(1, 1e12));
    v("seed", seed, "seed for initialisation and dropout", between(0, 9.2e18));
    v("threads", threads, "intra-op CPU threads (0 = all cores)", between(0, 1024));
    v("device", device, "cpu, cuda or cuda:N");
    v("peak_tflops", peak_tflops, "device peak for MFU (0 = known GPU peak / measured CPU matmul rate)", between(0, 1e6));
    v("time_limit", time_limit,
      "wall seconds this process trains before it checkpoints and stops with exit code 3 (0 = no limit)",
      between(0, 1e9));
    v("trace_step", trace_step,
      "with parallel.pp > 1 or memory.swap, write this step's pipeline or swap timeline into the run directory: "
      "measured and planned SVG pictures (and for a pipeline a Chrome trace) (0 = none)",
      between(0, 1e12));
    v("tensorboard", tensorboard,
      "write the scalars of metrics.jsonl into the run directory as TensorBoard's event file, "
      "events.out.tfevents.tessera (tensorboard --logdir runs/; docs/training.md)");
    v("plan_cluster", plan_cluster,
      "a cluster file or preset (clusters/; `tessera plan calibrate` writes this machine's): the planner predicts this "
      "run's step at start and the run prints its measured step beside it after step 5, in metrics.jsonl too "
      "(docs/plan.md; \"\" = none)");
  }
  void check(const std::string& source) const;
  // Micro-batches per step on each of `dp` data-parallel ranks: grad_accum, or with
  // global_batch_size set, global_batch_size / (batch_size x dp); throws naming the keys when it
  // does not divide or contradicts an explicit grad_accum. (Inline: the layout checks and the
  // planner, below the trainer, need it.)
  int64_t accumulation(int64_t dp) const {
    if (global_batch_size == 0) return grad_accum;
    const int64_t per_micro_batch = batch_size * dp;
    require(global_batch_size % per_micro_batch == 0, "train.global_batch_size = ", global_batch_size,
            " is not a multiple of train.batch_size x data-parallel ranks = ", batch_size, " x ", dp, " = ",
            per_micro_batch);
    const int64_t derived = global_batch_size / per_micro_batch;
    require(grad_accum == 1 || grad_accum == derived, "train.global_batch_size = ", global_batch_size,
            " with train.batch_size = ", batch_size, " on ", dp, " data-parallel ranks means ", derived,
            " micro-batches per step, but train.grad_accum = ", grad_accum, " says otherwise: give one of the two");
    return derived;
  }
};

struct EvalOptions {
  int64_t every = 100;   // steps between evaluations (0 = only at the end)
  int64_t batches = 20;  // validation batches per evaluation

  template <class V>
  void visit(V& v) {
    v("every", every, "steps between validation-loss evaluations (0 = only at the end)", between(0, 1e12));
    v("batches", batches, "validation batches per evaluation", between(1, 1e6));
  }
  void check(const std::string& source) const;
};

struct CheckpointOptions {
  int64_t every = 0;  // steps between checkpoints (0 = only at the end)
  int64_t keep = 3;   // newest checkpoints kept (0 = all)
  // Hosts without a shared filesystem: rank 0 writes every file of a checkpoint into its --out
  // (the other ranks send theirs over the network), and on resume sends the checkpoint to the
  // ranks that do not hold it. Without it, --out must be one directory every rank sees.
  bool gather = false;

  template <class V>
  void visit(V& v) {
    v("every", every, "steps between checkpoints (0 = only at the end of training)", between(0, 1e12));
    v("keep", keep, "newest checkpoints kept on disk (0 = keep all)", between(0, 1e6));
    v("gather", gather,
      "rank 0 writes whole checkpoints, the other ranks send their shards over the network (hosts without a shared "
      "--out); a resume sends the checkpoint to the ranks that lack it");
  }
  void check(const std::string& source) const;
};

struct MemoryOptions {
  std::string activation_checkpointing = "none";
  std::string activation_compression = "none";  // memory/activation_codec.h
  std::string attention_compression = "same";    // the attention core's codec (memory/saved_activations.h)
  double activation_bits = 6;         // adaptive: the average bits an element of the saved tensors may hold
  int64_t activation_probe_every = 500;  // adaptive: steps between sensitivity probes (0: only the first)
  int64_t activation_offload = 0;                // blocks whose saved activations wait on the host
  std::string activation_policy = "manual";      // manual | auto (plan/activation_policy.h)
  int64_t resident_micro_batches = 0;  // pipeline: micro-batches a rank holds on the device (0: all)
  bool swap = false;                    // ATOM: the model in host memory, swapped through the device
  double device_budget_gb = 0;          // swap: device memory the plan may use
  double modelled_bandwidth_gbps = 16;  // swap on a CPU "device": the modelled host <-> device link
  std::vector<int64_t> swap_blocks;     // swap: blocks per sub-model by hand (empty: the partitioner)
  std::string swap_copies = "auto";     // swap: what a LOAD moves: auto, fp32 or bf16

  template <class V>
  void visit(V& v) {
    v("activation_checkpointing", activation_checkpointing,
      "none, full (recompute each block) or selective (recompute attention only)");
    v("activation_compression", activation_compression,
      "how the tensors each block saves for its backward are kept: none, lossless (bool masks as bits), bf16 "
      "(float32 ones rounded), fp8, int8 or int4 (per 32 elements of the last dimension, with a float32 scale; "
      "docs/memory.md); adaptive: each saved tensor kept, int8 or int4 by its measured sensitivity within "
      "activation_bits (GACT's way; memory/adaptive_codecs.h); with activation_policy = auto: the encoding each "
      "block may choose");
    v("attention_compression", attention_compression,
      "the codec of what each block's attention core saves (q, k, v, the kernel's tensors and its output), whose "
      "rounding moves the gradients most: same (activation_compression's, or the codec the policy chooses for the "
      "block), none, lossless, bf16, fp8, int8 or int4 (e.g. int8 beside activation_compression = int4; "
      "docs/memory.md)");
    v("activation_bits", activation_bits,
      "with activation_compression = adaptive: the average bits an element of the saved tensors may hold, scales "
      "included (int4 holds 5, int8 9, a kept float32 32)",
      between(5, 64));
    v("activation_probe_every", activation_probe_every,
      "with activation_compression = adaptive: steps between the probes that measure each saved tensor's "
      "sensitivity and choose its codec again (0 = at the first step only)",
      between(0, 1e12));
    v("activation_offload", activation_offload,
      "the first N blocks keep what they save for the backward in host memory between their forward and backward, "
      "fetched back ahead of it on a copy stream (0 = none; model.n_layer = all; docs/memory.md)",
      between(0, 1e6));
    v("resident_micro_batches", resident_micro_batches,
      "under a pipeline: the most micro-batches (of one stage each) whose saved activations a rank keeps on the "
      "device; a forward run while that many wait for their backward keeps every block's in host memory, fetched "
      "back ahead of its backward (0 = every micro-batch on the device; docs/memory.md)",
      between(0, 1e6));
    v("activation_policy", activation_policy,
      "manual (the keys above, for every block) or auto: each block keeps, offloads or recomputes its activations, "
      "encoded or not by activation_compression's codec, chosen at start-up from the measured blocks to fit "
      "memory.device_budget_gb at the least predicted step time (docs/memory.md)");
    v("swap", swap,
      "keep the model's weights, gradients and optimizer state in host memory and stream it through the device "
      "sub-model by sub-model with prefetch (ATOM; docs/swap.md)");
    v("device_budget_gb", device_budget_gb,
      "with swap: the device memory (GiB) the swap plan may use for sub-models and activations; with "
      "activation_policy = auto: the device memory (GiB) the model's state and the blocks' activations may use",
      between(0, 1e6));
    v("modelled_bandwidth_gbps", modelled_bandwidth_gbps,
      "with swap or activation_offload on a CPU device: the host <-> device bandwidth (GB/s) each way the copies are "
      "throttled to (0 = unthrottled); on CUDA the link is real", between(0, 1e6));
    v("swap_blocks", swap_blocks,
      "with swap: blocks per sub-model, summing to model.n_layer (empty: the partitioner picks them)");
    v("swap_copies", swap_copies,
      "with swap: the parameter copies a LOAD moves over the link: bf16 (half the bytes; needs precision.dtype = "
      "bf16), fp32, or auto (bf16 under precision.dtype = bf16, else fp32)");
  }
  // Whether a swapped run's LOADs move bf16 copies, under precision.dtype `dtype`.
  bool swap_bf16_copies(const std::string& dtype) const {
    return swap_copies == "bf16" || (swap_copies == "auto" && dtype == "bf16");
  }
  void check(const std::string& source) const;
};

}  // namespace tessera
