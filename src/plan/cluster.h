// A cluster the planner predicts for (`tessera plan --cluster NAME|PATH`, docs/plan.md): a TOML
// file under clusters/ (found as configs/ are: $TESSERA_CLUSTER_DIR, then beside the binary) or a
// path. Every number in a preset names its source in a comment beside it.
//
//   [cluster]     what it is; devices per node; how much compute slows when a node's devices all
//                 compute at once (CPU cores sharing memory; 1 for GPUs)
//   [device]      one accelerator: peak and achievable matrix-product rates by dtype (the
//                 achievable one is a measured large-GEMM rate, e.g. the maximum achievable matmul
//                 FLOPS of a public benchmark: the planner never assumes the peak), memory size,
//                 memory bandwidth as achieved by streaming kernels, and the fixed cost of one kernel;
//                 optionally a table of measured product rates by shape (matmul_table.h)
//   [intra_node]  the link between devices of one node, as a collective sees it: all-reduce bus
//                 bandwidth (nccl-tests' busbw: bytes x 2(n-1)/n over time) and per-step latency
//   [inter_node]  the same per device across nodes (its share of the node's adapters)
//   [host]        host memory per node, the host <-> device copy bandwidth and the rate of the
//                 host's optimizer step (offload, swap)
//   [peers]       optional: the link between the peers of an ATOM swarm (`tessera peer`: one
//                 device each), each direction, and the fixed cost of one averaging round (its
//                 matchmaking); absent, the planner plans no swarm
//
// A collective of a group is priced on the slowest tier it crosses: within one node, the intra-node
// bandwidth; across nodes, the inter-node bandwidth of one device times the group's members on one
// node (NCCL's rings use that many adapters at once), at most the intra-node bandwidth.
//
// Refusals name the file and the key: unknown sections and keys (with the closest known key),
// values outside their ranges, a missing file (with the presets found).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "core/options.h"
#include "plan/matmul_table.h"

namespace tessera::plan {

struct ClusterInfo {
  std::string description;
  int64_t devices_per_node = 8;
  int64_t nodes = 0;  // 0: as many as the world needs
  double shared_slowdown = 1;  // products' time with every device of a node busy over one alone (CPU cores)
  double shared_slowdown_memory = 0;  // the same for memory-bound kernels (0: shared_slowdown)

  template <class V>
  void visit(V& v) {
    v("description", description, "what the cluster is, in words");
    v("devices_per_node", devices_per_node, "accelerators per node", between(1, 1024));
    v("nodes", nodes, "nodes in the cluster (0 = as many as a world needs)", between(0, 1 << 20));
    v("shared_slowdown", shared_slowdown,
      "compute time with all devices_per_node ranks of a node computing at once over one rank alone (CPU cores "
      "share memory bandwidth and caches; 1 for GPUs): the matrix products'", between(1, 100));
    v("shared_slowdown_memory", shared_slowdown_memory,
      "the same for memory-bound kernels (norms, activations, the optimizer step, copies), which slow down more "
      "than products when CPU cores share memory bandwidth (0 = shared_slowdown)", between(0, 100));
  }
  // The factor on a rank's compute when `ranks` ranks of the world share a node: 1 alone,
  // shared_slowdown with the node full, linear between.
  double slowdown(int64_t world) const { return sharing(shared_slowdown, static_cast<double>(world)); }
  double memory_slowdown(int64_t world) const {
    return sharing(shared_slowdown_memory > 0 ? shared_slowdown_memory : shared_slowdown, static_cast<double>(world));
  }
  // The same at a mean count of ranks computing (plan/shared_cores.h).
  double slowdown_at(double ranks) const { return sharing(shared_slowdown, ranks); }

 private:
  double sharing(double full, double ranks) const {
    const double on_node = std::min(ranks, static_cast<double>(devices_per_node));
    if (devices_per_node <= 1 || on_node <= 1) return 1;
    return 1 + (full - 1) * (on_node - 1) / static_cast<double>(devices_per_node - 1);
  }
};

struct DeviceSpec {
  std::string name;
  std::string kind = "cuda";           // cuda | cpu
  double peak_tflops_bf16 = 0;         // dense, no sparsity (also fp16)
  double peak_tflops_fp32 = 0;
  double matmul_tflops_bf16 = 0;       // achievable by large matrix products (measured)
  double matmul_tflops_fp32 = 0;
  double memory_gib = 0;
  double memory_gbs = 0;               // achieved by streaming (elementwise) kernels
  double kernel_overhead_us = 0;       // fixed cost of one kernel (launch and tail)
  double matmul_overhead_us = 0;       // a product's fixed cost beyond it (a fitted curve's intercept)
  // CPU devices: bytes per second a core moves through a socket (calibrated on loopback, where a
  // transfer is all copying); what a send's copying takes from a core where every core computes,
  // whatever the link's rate (0: the link tier's bandwidth).
  double socket_gbs = 0;
  double attention_tflops_bf16 = 0;    // softmax attention's fused kernel (0: the matmul rate)
  double attention_tflops_fp32 = 0;
  // The activation codecs encoding and decoding a saved activation, float32 source bytes per
  // second (tessera plan calibrate); 0: not measured, and memory.activation_compression with that
  // codec is refused on this cluster.
  double activation_codec_int8_gbs = 0, activation_codec_int4_gbs = 0, activation_codec_fp8_gbs = 0,
         activation_codec_bf16_gbs = 0;
  // A CSV of measured bf16 product rates by shape (plan/matmul_table.h), relative to the cluster
  // file; empty: every bf16 product at matmul_tflops_bf16. Read into `matmul_rates`.
  std::string matmul_table;
  MatmulTable matmul_rates;

  template <class V>
  void visit(V& v) {
    v("name", name, "the device's name");
    v("kind", kind, "cuda or cpu");
    v("peak_tflops_bf16", peak_tflops_bf16, "dense bf16/fp16 peak (TFLOP/s; the MFU denominator)", above(0, 1e6));
    v("peak_tflops_fp32", peak_tflops_fp32, "dense fp32 peak (TFLOP/s)", above(0, 1e6));
    v("matmul_tflops_bf16", matmul_tflops_bf16, "achievable bf16 matrix-product rate, measured (TFLOP/s)",
      above(0, 1e6));
    v("matmul_tflops_fp32", matmul_tflops_fp32, "achievable fp32 matrix-product rate, measured (TFLOP/s)",
      above(0, 1e6));
    v("memory_gib", memory_gib, "device memory (GiB)", above(0, 1e6));
    v("memory_gbs", memory_gbs, "memory bandwidth streaming kernels achieve (GB/s)", above(0, 1e7));
    v("kernel_overhead_us", kernel_overhead_us, "fixed cost of one kernel (microseconds)", between(0, 1e6));
    v("matmul_overhead_us", matmul_overhead_us,
      "a product's fixed cost beyond kernel_overhead_us: time = overhead + FLOPs / matmul rate, fitted by `tessera "
      "plan calibrate` (microseconds)", between(0, 1e6));
    v("socket_gbs", socket_gbs,
      "cpu devices: bytes per second a core moves through a socket, the copying a send takes from a core where every "
      "core computes (GB/s; `tessera plan calibrate`: its loopback all-reduce; 0 = the link tier's bandwidth)",
      between(0, 1e7));
    v("attention_tflops_bf16", attention_tflops_bf16,
      "softmax attention's fused kernel, forward and backward, counted as the planner counts it (the causal half; "
      "backward 2.5x the forward), measured (TFLOP/s; 0 = the matmul rate)", between(0, 1e6));
    v("attention_tflops_fp32", attention_tflops_fp32, "the same in fp32 (0 = the matmul rate)", between(0, 1e6));
    v("activation_codec_int8_gbs", activation_codec_int8_gbs,
      "int8 activation encoding and decoding, float32 source bytes per second (GB/s; `tessera plan calibrate`; 0 = "
      "not measured)", between(0, 1e7));
    v("activation_codec_int4_gbs", activation_codec_int4_gbs, "the same for int4 (GB/s; 0 = not measured)",
      between(0, 1e7));
    v("activation_codec_fp8_gbs", activation_codec_fp8_gbs, "the same for fp8 (GB/s; 0 = not measured)", between(0, 1e7));
    v("activation_codec_bf16_gbs", activation_codec_bf16_gbs, "the same for bf16 (GB/s; 0 = not measured)",
      between(0, 1e7));
    v("matmul_table", matmul_table,
      "a CSV of measured bf16 product rates by shape (rows,cols,depth,tflops_bf16), relative to this file: bf16 "
      "products are priced from it in place of matmul_tflops_bf16");
  }
  // The rates for a run in 16-bit (`half`: bf16/fp16 autocast) or in fp32, TFLOP/s; the attention
  // kernel's falls back to the matmul rate where the file gives none.
  double peak_tflops(bool half) const { return half ? peak_tflops_bf16 : peak_tflops_fp32; }
  double memory_bytes() const { return memory_gib * 1024.0 * 1024.0 * 1024.0; }
  double matmul_tflops(bool half) const { return half ? matmul_tflops_bf16 : matmul_tflops_fp32; }
  // One [rows, depth] x [depth, cols] product's rate: the table's in 16-bit where the file has one,
  // else matmul_tflops.
  double product_tflops(bool half, double rows, double cols, double depth) const {
    return half && !matmul_rates.empty() ? matmul_rates.tflops(rows, cols, depth) : matmul_tflops(half);
  }
  double attention_tflops(bool half) const {
    const double fused = half ? attention_tflops_bf16 : attention_tflops_fp32;
    return fused > 0 ? fused : matmul_tflops(half);
  }
};

struct LinkSpec {
  double bandwidth_gbs = 0;     // all-reduce bus bandwidth (GB/s)
  double latency_us = 0;        // per ring step
  double call_overhead_us = 0;  // per collective call, beyond its steps

  template <class V>
  void visit(V& v) {
    v("bandwidth_gbs", bandwidth_gbs, "all-reduce bus bandwidth a collective achieves (GB/s, per device)",
      above(0, 1e6));
    v("latency_us", latency_us, "latency of one step of a ring (microseconds)", between(0, 1e9));
    v("call_overhead_us", call_overhead_us,
      "each collective call's fixed cost beyond its ring steps (microseconds): where ranks share CPU cores, the "
      "wait at the sync point for the other ranks' compute, which varies from call to call (calibrated under "
      "load; 0 for GPUs)", between(0, 1e9));
  }
};

struct HostSpec {
  double memory_gib = 0;       // per node
  double device_link_gbs = 0;  // host <-> device copies, per device
  double optimizer_gbs = 0;    // the host's optimizer step per rank, bytes as the planner counts them

  template <class V>
  void visit(V& v) {
    v("memory_gib", memory_gib, "host memory per node (GiB)", between(0, 1e7));
    v("device_link_gbs", device_link_gbs, "host <-> device copy bandwidth per device (GB/s)", between(0, 1e6));
    v("optimizer_gbs", optimizer_gbs,
      "the optimizer step on the host (offload, swap), per rank with the node's ranks all stepping: bytes per second "
      "as the planner counts them (AdamW 28 per element, SGD 20; 0 = unknown: offload and swap are not planned)",
      between(0, 1e6));
  }
};

// The peers of an ATOM swarm: each one device on a host of its own, averaging over this link
// (atom/averaging.h: 2 (n-1)/n of the vector each way; two latencies by the butterfly, 2 (n-1)
// round a ring), and the host CPU a round spends per byte it sends (plan/swarm_cost.h).
struct PeersSpec {
  double bandwidth_gbs = 0;     // each direction, per peer (0: no swarm is planned)
  double latency_us = 0;
  double round_overhead_ms = 0; // one averaging round's fixed cost beyond its transfer (matchmaking, the DHT)
  double cpu_ns_per_byte = 0;   // a round's CPU per byte sent, sender's and receiver's (0: not priced)

  template <class V>
  void visit(V& v) {
    v("bandwidth_gbs", bandwidth_gbs, "a peer's link, each direction (GB/s; 0 = no swarm is planned)", between(0, 1e6));
    v("latency_us", latency_us, "one message's latency between peers (microseconds)", between(0, 1e9));
    v("round_overhead_ms", round_overhead_ms,
      "an averaging round's fixed cost beyond its transfer: choosing the group, the records it waits for "
      "(milliseconds)", between(0, 1e9));
    v("cpu_ns_per_byte", cpu_ns_per_byte,
      "a round's CPU per byte a peer sends, its encryption and the receiver's decryption, socket copies and sums "
      "(nanoseconds of one core; measured by tessera plan calibrate; 0 = not priced)", between(0, 1e6));
  }
};

struct Cluster {
  std::string source;  // the file it was read from
  ClusterInfo cluster;
  DeviceSpec device;
  LinkSpec intra_node;
  LinkSpec inter_node;
  HostSpec host;
  PeersSpec peers;

  template <class F>
  void for_each_section(F&& f) {
    f("cluster", cluster);
    f("device", device);
    f("intra_node", intra_node);
    f("inter_node", inter_node);
    f("host", host);
    f("peers", peers);
  }
  // The bandwidth (GB/s) and latency (s) a collective of `members` (global ranks) runs at: the
  // slowest tier it crosses (this header's first paragraph).
  struct Tier {
    double bandwidth_bytes_per_s = 0;
    double latency_s = 0;
    bool crosses_nodes = false;
    double call_overhead_s = 0;
  };
  Tier tier(const std::vector<int64_t>& members) const;
  // The node of global rank `rank` (ranks fill nodes in order, devices_per_node each).
  int64_t node_of(int64_t rank) const { return rank / cluster.devices_per_node; }
  // The peers' link as a tier (a swarm's round).
  Tier peer_tier() const { return {peers.bandwidth_gbs * 1e9, peers.latency_us * 1e-6, true}; }
};

// The cluster named `name` (a file under clusters/) or at path `name`.
Cluster load_cluster(const std::string& name);
// The same from TOML text (`source` names it in refusals).
Cluster parse_cluster(const std::string& text, const std::string& source);
// The presets found (names without .toml).
std::vector<std::string> cluster_presets();

}  // namespace tessera::plan
