// Options of the training loop itself: [train], [eval], [checkpoint], [memory] sections.
#pragma once

#include <cstdint>
#include <string>

namespace tessera {

struct TrainOptions {
  int64_t steps = 1000;
  int64_t batch_size = 16;   // sequences per micro-batch
  int64_t seq_len = 128;     // tokens per sequence (<= model.block_size)
  int64_t grad_accum = 1;    // micro-batches per optimizer step
  int64_t log_every = 10;
  int64_t seed = 1337;       // model initialisation and dropout
  int64_t threads = 0;       // intra-op threads; 0 = all cores
  std::string device = "cpu";
  double peak_tflops = 0;    // for MFU; 0 = the device's known peak, or on CPU a measured matmul rate

  template <class V>
  void visit(V& v) {
    v("steps", steps, "optimizer steps to train for");
    v("batch_size", batch_size, "sequences per micro-batch");
    v("seq_len", seq_len, "tokens per sequence (at most model.block_size)");
    v("grad_accum", grad_accum, "micro-batches accumulated per optimizer step");
    v("log_every", log_every, "steps between metrics lines and progress updates");
    v("seed", seed, "seed for initialisation and dropout");
    v("threads", threads, "intra-op CPU threads (0 = all cores)");
    v("device", device, "cpu, cuda or cuda:N");
    v("peak_tflops", peak_tflops, "device peak for MFU (0 = known GPU peak / measured CPU matmul rate)");
  }
  void check(const std::string& source) const;
};

struct EvalOptions {
  int64_t every = 100;   // steps between evaluations (0 = only at the end)
  int64_t batches = 20;  // validation batches per evaluation

  template <class V>
  void visit(V& v) {
    v("every", every, "steps between validation-loss evaluations (0 = only at the end)");
    v("batches", batches, "validation batches per evaluation");
  }
  void check(const std::string& source) const;
};

struct CheckpointOptions {
  int64_t every = 0;  // steps between checkpoints (0 = only at the end)
  int64_t keep = 3;   // newest checkpoints kept (0 = all)

  template <class V>
  void visit(V& v) {
    v("every", every, "steps between checkpoints (0 = only at the end of training)");
    v("keep", keep, "newest checkpoints kept on disk (0 = keep all)");
  }
  void check(const std::string& source) const;
};

struct MemoryOptions {
  std::string activation_checkpointing = "none";

  template <class V>
  void visit(V& v) {
    v("activation_checkpointing", activation_checkpointing,
      "none, full (recompute each block) or selective (recompute attention only)");
  }
  void check(const std::string& source) const;
};

}  // namespace tessera
