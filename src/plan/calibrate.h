// `tessera plan calibrate --out F.toml`: this machine measured as a cluster file (plan/cluster.h)
// for the planner. One rank is one process with one intra-op thread (how tests, CI and the
// benchmarks here run several ranks on the cores), so the device is one core's share:
//
//   device.matmul_tflops_*, device.matmul_overhead_us  fp32 and bf16 products at several shapes,
//                        each its median over three rounds that time the shapes in turn, fitted as
//                        time = overhead + FLOPs / rate (every fit here by Theil and Sen: the
//                        median of the slopes between two points, robust to one disturbed point); the peak is the
//                        same measured rate (a CPU publishes no usable one: MFU on CPU reads
//                        "fraction of the achievable matmul rate", as train/device_peak.h)
//   device.attention_tflops_*  causal SDPA forward and backward at four shapes, timed and fitted as
//                        the products
//   device.memory_gbs    LayerNorm then GELU, forward and backward through autograd, at four sizes,
//                        with the bytes counted as model/operations.h counts them, fitted
//   device.kernel_overhead_us  a chain of adds on 8 elements, forward and backward through
//                        autograd, per kernel (a step's kernels run through autograd)
//   cluster.shared_slowdown    a product in `ranks` processes at once (forked, one thread each:
//                        memory and caches shared) over one alone; shared_slowdown_memory the same
//                        for LayerNorm and GELU forward and backward (memory-bound kernels slow down
//                        more)
//   intra_node.*         all-reduce between two processes that compute between calls (tessera's
//                        comm::Group, Gloo over loopback TCP), 1 KiB to 16 MiB, the mean call fitted
//                        as time = 2 latency + bytes x 2(n-1)/n / bandwidth
//   host.*               MemTotal; copies to "device" memory are the memory bandwidth; the host's
//                        optimizer step: tessera's AdamW over 4M elements, as bytes per second
//                        counted as the planner counts them, over cluster.shared_slowdown_memory
//   peers.*              the loopback link of the Gloo fit (peers on one machine); the round's
//                        fixed cost is not measured (0); cpu_ns_per_byte: four peers in this
//                        process averaging 16 MiB round a ring over TLS (atom/round_cpu.h, given
//                        by the caller as round_cpu_ns_per_byte; 0, not measured, without it)
// Each number is written with a comment saying what measured it and when. `progress` is told of
// each measurement as it starts.
//
// `tessera plan calibrate --device cuda` measures the first CUDA device instead (calibrate_card.cpp),
// as a one-node, one-device file, each point's kernels queued back to back for about 2 ms and
// timed to the device's completion (one synchronization per launch would add its latency to each):
//
//   device.matmul_table  bf16 products over a full grid of rows, cols and depth (768 to 32768), a
//                        CSV beside the file (plan/matmul_table.h); matmul_tflops_bf16 and
//                        matmul_overhead_us its fit; matmul_tflops_fp32 six float32 shapes, fitted
//   device.peak_tflops_* the card's published dense peak (train/device_peak.h), passed in
//   device.attention_tflops_bf16  causal SDPA forward and backward at five GPT-2 and Llama shapes
//   device.memory_gbs    LayerNorm then GELU on bf16, forward and backward, at four sizes (50M to
//                        400M elements), fitted
//   device.kernel_overhead_us  the chain of adds above, on the card
//   host.device_link_gbs pinned copies each way, 16 to 512 MiB, fitted: the slower way
//   host.optimizer_gbs   tessera's AdamW over 64M elements on every core's thread
//   intra_node, inter_node  not measured with one device: the host link, so stated in the file
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace tessera::plan {

struct CalibrateOptions {
  int64_t ranks = 0;              // ranks a node runs at once (0: the cores)
  double seconds_per_point = 0.2; // time spent on each measured point (more: steadier)
  // An averaging round's CPU per byte sent (atom/round_cpu.h: members, float32 elements, seconds),
  // from the caller: the planner does not link the swarm.
  std::function<double(int64_t, int64_t, double)> round_cpu_ns_per_byte;
};

std::string calibrate_this_machine(const CalibrateOptions& options, const std::function<void(const std::string&)>& progress);

struct CardPeaks {
  double bf16_tflops = 0, fp32_tflops = 0;
  std::string bf16_basis, fp32_basis;  // where each comes from
};

// The card's file text; writes its product grid to `table_path`, which the text names as
// `table_name` (a path relative to the file's folder). Refused in a build without CUDA and where
// no CUDA device is usable.
std::string calibrate_this_card(const CalibrateOptions& options, const CardPeaks& peaks, const std::string& table_path,
                                const std::string& table_name, const std::function<void(const std::string&)>& progress);

}  // namespace tessera::plan
