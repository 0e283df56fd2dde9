// The layout validator (layout_check.h).
#include "parallel/layout_check.h"

#include <algorithm>
#include <string>
#include <vector>

#include "comm/mesh.h"
#include "core/error.h"
#include "optim/compression/compressor.h"
#include "parallel/data/data_parallel.h"
#include "parallel/expert/expert_parallel.h"
#include "parallel/pipeline/schedule_builders.h"
#include "parallel/sequence/sequence_parallel.h"
#include "parallel/tensor/tensor_parallel.h"
#include "plan/layout.h"

namespace tessera {
namespace {

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) out += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return out;
}

// The option values only their components know.
void check_component_names(const ParallelOptions& p) {
  std::vector<std::string> schedules = pipeline::schedule_names();
  const bool known = std::find(schedules.begin(), schedules.end(), p.pp_schedule) != schedules.end();
  schedules.push_back("file:PATH");
  require(known || p.pp_schedule.rfind("file:", 0) == 0, "parallel.pp_schedule must be ", joined(schedules),
          " (got \"", p.pp_schedule, "\")");
  const std::vector<std::string>& compressors = compressor_names();
  require(std::find(compressors.begin(), compressors.end(), p.grad_compression) != compressors.end(),
          "parallel.grad_compression must be ", joined(compressors), " (got \"", p.grad_compression, "\")");
}

}  // namespace

void check_parallel_layout(const Config& config, const ParallelDims& d) {
  if (d.world_size() > 1) comm::choose_backend(config.parallel.backend, c10::Device(config.train.device));
  check_layout_options(config, d);
  require(!config.memory.swap || d.dp() == 1 || !c10::Device(config.train.device).is_cuda(),
          "memory.swap = true with parallel.dp = ", d.dp(), " on ", config.train.device, ": the replicas average "
          "their gradients in host memory, which needs a Gloo group beside NCCL's; not implemented yet (dp of "
          "swapped replicas runs on CPU devices)");
  if (d.pp() > 1) {
    // What a pipeline cannot train with in this build (inspect still plans it).
    const ParallelOptions& p = config.parallel;
    require(config.precision.dtype != "fp16", "precision.dtype = \"fp16\" with parallel.pp > 1: the loss scaler's "
            "overflow check would have to span every stage; use bf16 or fp32");
    require(!p.zero3_reshard_per_microbatch || d.dp() * d.sp() > 1 || p.offload,
            "parallel.zero3_reshard_per_microbatch = true with one data-parallel replica per stage (", d.describe(),
            ") and no offload: ZeRO-3 has no replicas to shard the parameters over; leave it false");
    require(p.grad_compression == "none", "parallel.pp > 1 with parallel.grad_compression = ", p.grad_compression,
            ": not implemented yet (the compressors' state is kept over one data-parallel group per model); use none");
  }
}

void check_layout_options(const Config& config, const ParallelDims& d) {
  check_component_names(config.parallel);
  check_expert_parallel(config.model, config.parallel, config.memory, d);
  make_layout(config, d);  // the cut (no stage without a block) and the schedule for the step's micro-batches
  if (config.precision.dtype == "fp16") {
    require(d.dp() * d.sp() * d.tp() == 1, "precision.dtype = \"fp16\" with ", d.describe(),
            ": fp16 master weights and loss scaling are kept by the one-process optimizer only (the data-parallel "
            "shards and the tensor-parallel overflow check would need their own); use bf16 or fp32");
    require(!config.parallel.offload, "precision.dtype = \"fp16\" with parallel.offload = true: ZeRO-Offload's host "
            "optimizer keeps no fp16 master weights or loss scaler; use bf16 or fp32, or parallel.offload = false");
  }
  if (config.memory.swap) {
    // The swap engine trains data-parallel replicas of a whole model, each on one device (docs/swap.md).
    const MemoryOptions& m = config.memory;
    require(d.world_size() == d.dp(), "memory.swap = true with ", d.describe(), ": the swap engine trains "
            "data-parallel replicas (parallel.dp) only; swapping with tp, pp, sp or ep is not implemented yet");
    require(config.parallel.zero_stage == 0 && !config.parallel.offload, "memory.swap = true with parallel.zero_stage = ",
            config.parallel.zero_stage, config.parallel.offload ? " and parallel.offload = true" : "",
            ": swapping keeps the whole training state in host memory itself; set zero_stage = 0 and offload = false");
    require(config.precision.dtype != "fp16", "memory.swap = true with precision.dtype = \"fp16\": the host optimizer "
            "keeps no fp16 loss scaler; use bf16 or fp32");
    require(m.swap_copies != "bf16" || config.precision.dtype == "bf16", "memory.swap_copies = \"bf16\" with "
            "precision.dtype = \"", config.precision.dtype, "\": bf16 copies would round an fp32 run's weights; use "
            "precision.dtype = \"bf16\" or memory.swap_copies = \"auto\"");
    int64_t blocks = 0;
    for (int64_t b : m.swap_blocks) blocks += b;
    require(m.swap_blocks.empty() || blocks == config.model.n_layer, "memory.swap_blocks sums to ", blocks,
            " blocks, but model.n_layer = ", config.model.n_layer);
  }
  check_tensor_parallel(config.model, config.parallel, d, config.train.seq_len, config.optim.name);
  check_sequence_parallel(config.model, config.parallel, d, config.train.seq_len);
  check_data_parallel(config.parallel, config.optim);
}

}  // namespace tessera
