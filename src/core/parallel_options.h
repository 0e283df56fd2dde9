// The [parallel] section: how many ranks each parallelism gets, how data parallelism shards its
// state, and how collectives behave. ParallelDims (parallel_dims.h) turns the degrees into a mesh.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/options.h"

namespace tessera {

struct ParallelOptions {
  int64_t dp = 0;  // data-parallel degree; 0 = world size / (tp * pp * sp)
  int64_t tp = 1;
  int64_t pp = 1;
  std::string pp_schedule = "1f1b";  // gpipe, 1f1b, interleaved, zbh1, zbv, dualpipev, file:PATH (parallel/pipeline)
  int64_t pp_virtual = 0;            // stages per pipeline rank; 0 = the schedule's (2 for interleaved, zbv, dualpipev)
  std::string pp_cut = "layers";     // layers | params | profile (plan/stage_cut.h)
  std::vector<int64_t> pp_layers;    // blocks per stage, set by hand (empty: cut by pp_cut)
  std::string pp_transfer_dtype = "compute";  // compute (bf16 under autocast) | float32: on the wire
  std::string pp_schedule_costs = "measured";  // zbv's and zbh1's tables: measured (rebuilt after step 2) | unit
  int64_t sp = 1;
  int64_t ep = 1;  // expert parallelism, carved out of the data-parallel ranks (divides dp)
  std::string ep_dispatch = "alltoall";  // alltoall | hierarchical (parallel/expert/hierarchical_dispatch.h)
  int64_t ranks_per_node = 0;  // processes per node, global ranks node-contiguous; 0 = the launcher's
  bool megatron_sp = false;  // with tp > 1: LayerNorm/dropout regions split along the sequence
  std::string sp_method = "auto";  // auto (lasp for linear attention), lasp, lasp2, ulysses, ring
  int64_t zero_stage = 0;
  bool zero3_reshard_per_microbatch = false;  // pp > 1, ZeRO-3: gather a stage around each action
  double bucket_mb = 4;        // gradient bucket size for overlapped reduction
  double timeout_s = 120;      // a collective or rendezvous that takes longer fails, naming the rank
  int64_t max_restarts = 0;    // launcher: restarts on the surviving workers from the last checkpoint
  std::string backend = "auto";  // auto (gloo on CPU, nccl on CUDA), gloo, nccl
  bool offload = false;          // optimizer state and step on the CPU (ZeRO-Offload)
  std::string grad_compression = "none";  // none, bf16, fp16, powersgd, topk
  int64_t powersgd_rank = 4;
  int64_t powersgd_start_step = 10;  // uncompressed steps before PowerSGD starts
  double topk_ratio = 0.01;
  int64_t topk_start_step = 100;   // plain all-reduce steps before top-k starts
  int64_t topk_warmup_steps = 0;   // steps over which the sent fraction falls from dense to topk_ratio

  template <class V>
  void visit(V& v) {
    v("dp", dp, "data-parallel degree (0 = whatever the other degrees leave of the world size)", between(0, 1 << 20));
    v("tp", tp, "tensor-parallel degree", between(1, 4096));
    v("pp", pp, "pipeline-parallel degree", between(1, 4096));
    v("pp_schedule", pp_schedule,
      "pipeline schedule: gpipe, 1f1b, interleaved, zbh1, zbv, dualpipev, or file:PATH (a CSV table; `tessera "
      "pipeline`)");
    v("pp_virtual", pp_virtual,
      "stages per pipeline rank (0 = the schedule's: 2 for interleaved, zbv and dualpipev, else 1)", between(0, 64));
    v("pp_cut", pp_cut,
      "how blocks are cut into stages: layers (equal block counts), params (balanced parameters, the embedding and "
      "the tied head counted with the first and last stage) or profile (balanced forward + backward time, measured "
      "by the workers at start, the embedding and the head and loss counted)");
    v("pp_layers", pp_layers,
      "the cut by hand: blocks per pipeline stage, in stage order (pp x stages per rank entries summing to "
      "model.n_layer); empty = cut by pp_cut");
    v("pp_transfer_dtype", pp_transfer_dtype,
      "the dtype activations and their gradients travel in between pipeline stages: compute (the autocast dtype "
      "under precision.dtype = bf16: half the bytes of float32; the residual stream is rounded once at each stage "
      "boundary) or float32 (bit-equal to one process)");
    v("pp_schedule_costs", pp_schedule_costs,
      "what zbv's and zbh1's tables are built for: measured (after step 2, each stage's measured F, I and W, and "
      "B from the start-up profile, averaged over the world; kept where the simulator finds it faster than the "
      "unit-cost table) or unit (F = I = W)");
    v("sp", sp, "sequence-parallel degree", between(1, 4096));
    v("ep", ep, "expert-parallel degree (taken from the data-parallel ranks; divides dp)", between(1, 4096));
    v("ep_dispatch", ep_dispatch,
      "how tokens reach their experts' ranks: alltoall (one row per routed choice, one all-to-all each way) or "
      "hierarchical (DeepSeek-V3's: each token crosses to another node once per node it needs, then once per rank "
      "within it; the gates are applied where the experts run and the outputs summed on the way back)");
    v("ranks_per_node", ranks_per_node,
      "processes per node (global ranks fill nodes in order); 0 = the launcher's (LOCAL_WORLD_SIZE, --nproc). "
      "Hierarchical expert dispatch routes by it, and the expert all-to-all counts its bytes to other nodes",
      between(0, 1 << 20));
    v("megatron_sp", megatron_sp,
      "with tp > 1, Megatron sequence parallelism: norms and residuals split along the sequence, all-gather / "
      "reduce-scatter at region borders");
    v("sp_method", sp_method,
      "sequence parallelism: auto (lasp for linear attention), lasp (state ring), lasp2 (state all-gather), "
      "ulysses, ring");
    v("zero_stage", zero_stage, "0 = DDP, 1 = shard optimizer state, 2 = + gradients, 3 = + parameters", between(0, 3));
    v("zero3_reshard_per_microbatch", zero3_reshard_per_microbatch,
      "with pp > 1 and zero_stage 3: gather a stage's parameters around each forward and backward action and shard "
      "them again after (less memory, one all-gather per action) instead of once per step");
    v("bucket_mb", bucket_mb, "gradient bucket size in MB for reduction overlapped with backward", above(0, 65536));
    v("timeout_s", timeout_s, "seconds before a stuck rendezvous or collective fails every rank", above(0, 1e6));
    v("max_restarts", max_restarts,
      "times the launchers (--nproc, on one node or --nnodes) restart a failed run on the surviving workers "
      "from the last checkpoint, data parallelism shrunk to fit",
      between(0, 1000));
    v("backend", backend, "auto (gloo on CPU, nccl on CUDA), gloo or nccl");
    v("offload", offload,
      "keep optimizer state and run the optimizer step on the CPU (ZeRO-Offload; needs zero_stage 1-3 and AdamW)");
    v("grad_compression", grad_compression, "none, bf16, fp16, powersgd or topk");
    v("powersgd_rank", powersgd_rank, "rank of the PowerSGD approximation", between(1, 4096));
    v("powersgd_start_step", powersgd_start_step, "uncompressed steps before PowerSGD starts", between(0, 1e12));
    v("topk_ratio", topk_ratio, "fraction of gradient entries top-k compression sends", above(0, 1));
    v("topk_start_step", topk_start_step, "uncompressed steps before top-k starts", between(0, 1e12));
    v("topk_warmup_steps", topk_warmup_steps,
      "steps after topk_start_step over which top-k's sent fraction falls geometrically from dense to topk_ratio", between(0, 1e12));
  }
  void check(const std::string& source) const;
  // pp_virtual with 0 resolved: 2 for interleaved, zbv and dualpipev, 1 otherwise.
  int64_t pipeline_virtual() const;
  // Whether the table is built again after step 2 for the measured costs: zbv and zbh1 (which run
  // backwards whole where that costs less) under pp_schedule_costs = measured.
  bool table_for_measured_costs() const;
};

}  // namespace tessera
