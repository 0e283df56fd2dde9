// What each block kind runs, as data for the planner (plan/cost_model.h): one rank's operations for
// one micro-batch, each with its forward FLOPs and bytes moved, and the communication the layout
// makes the block do. A new block kind declares its operations here, beside the others, so the
// planner prices it without knowing it.
//
// Conventions, per rank (tensor-parallel shares taken: heads and FFN widths / tp; tokens / sp):
//   matmul    2 x m x n x k FLOPs; bytes: both operands and the output at `element_bytes`. With a
//             weight (`weight`), its backward is an input-gradient and a weight-gradient product of
//             the same FLOPs each; the attention's products with themselves (scores, p x v) have no
//             weight and a backward of `backward_factor` x the forward (2 as counted: dQ, dK, dV;
//             2.5 for flash attention, whose backward recomputes the scores).
//   memory    an elementwise or reduction kernel bound by bandwidth: norms, activations, residual
//             adds, dropout, rotary, the unfused softmax; backward `backward_factor` x its bytes.
//   tp_all_reduce, ep_all_to_all, sp_all_to_all  `elements` per forward over the named group; the
//             backward moves as many (Megatron's f / g pairs, the experts' dispatch and combine).
//   sp_ring   `elements` sent to the next rank at each of sp - 1 steps (LASP's state), forward and
//             again backward.
//   sp_kv_ring  ring attention's keys and values (`elements`): sent to the next rank at each of
//             sp - 1 steps, forward and again backward, and in the backward their gradients'
//             float32 accumulator around the whole ring, sp send-receives
//             (parallel/sequence/ring_attention.cpp).
//   ep_between_nodes, ep_within_node  hierarchical expert dispatch's two hops
//             (parallel/expert/hierarchical_dispatch.h): `elements` that leave this rank for other
//             nodes, or for the other ranks of its node, per forward; the backward as many. Three
//             calls per hop and direction in the forward (counts, expert ids, rows), one in the
//             backward. Expected counts for tokens routed uniformly: a token reaches
//             M (1 - C(E - E/M, k) / C(E, k)) of the ep group's M nodes, or min(topk_groups, k)
//             under group-limited routing whose groups are the nodes (moe_groups = M), (M-1)/M of
//             them another node; in a node it reaches, its k / nodes choices hit each of the
//             node's R ranks with the same hypergeometric chance, (R-1)/R of those another rank.
// The softmax attention core counts the causal half (PaLM's convention, as flops_per_token does)
// with attention = flash; with attention = unfused (the scores materialized, as Megatron-LM ran
// before fused attention kernels) it computes and moves the whole square.
//
// The weights' elements per rank are declared with their products (the data-parallel reduction's
// size); norm weights and biases are left out (parts in 10^4 of a block).
//
// Checked: the matmul FLOPs x 3 of a model's blocks, embedding and head equal flops_per_token
// (model/model_size.h) x tokens at tp = sp = 1 (tests/unit/test_plan.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/model_options.h"

namespace tessera {

struct OperationShape {
  int64_t batch = 1;             // sequences per micro-batch
  int64_t seq_len = 1;           // tokens per sequence (the attention span)
  int64_t tp = 1, sp = 1, ep = 1;
  bool ep_hierarchical = false;  // parallel.ep_dispatch = hierarchical
  int64_t ep_nodes = 1;          // nodes the ep group spans (its ranks spread evenly over them)
  bool megatron_sp = false;      // norms and residuals split over tp along the sequence
  std::string sp_method = "ulysses";  // with sp > 1: ulysses, ring, lasp, lasp2
  int64_t element_bytes = 2;     // activations and the weights a product reads (2 under bf16/fp16)
  std::string attention = "flash";  // flash | unfused
  double dropout = 0;
  // Dropless routing with ep > 1: the busiest rank's expert rows over an even share (plan's
  // CostOptions::expert_load); its experts' products are priced at that many rows.
  double expert_load = 1;
  // Tokens this rank holds of the micro-batch.
  double tokens() const { return static_cast<double>(batch * seq_len) / static_cast<double>(sp); }
};

struct Operation {
  enum class Kind { matmul, memory, tp_all_reduce, ep_all_to_all, ep_between_nodes, ep_within_node, sp_all_to_all, sp_ring, sp_kv_ring };
  std::string name;          // "attention.qkv", "mlp.fc", ...
  Kind kind = Kind::memory;
  double flops = 0;          // forward
  double bytes = 0;          // forward, moved through device memory
  double elements = 0;       // communication: elements moved (at element_bytes each)
  bool weight = false;       // a product with a weight (backward: input and weight gradients)
  double parameters = 0;     // elements of the weight this rank holds (the experts': all of its own)
  double backward_factor = 2;
  // Part of the attention core (what selective checkpointing recomputes).
  bool attention_core = false;
  // The fused (flash) attention kernel: priced at the device's attention rate, not its GEMM rate.
  bool fused_attention = false;
  // One product's shape, [rows, depth] x [depth, cols], for a device that prices products by shape
  // (plan/matmul_table.h); 0 where the operation is no single product (the attention core).
  double rows = 0, cols = 0, depth = 0;
  bool expert = false;  // the routed experts' weights (reduced over their own replicas, "edp")
};

std::vector<Operation> block_operations(const ModelOptions& model, int64_t layer, const OperationShape& shape);
// The token (and position) embedding's lookup, and the final norm, head and loss.
std::vector<Operation> embedding_operations(const ModelOptions& model, const OperationShape& shape);
std::vector<Operation> head_operations(const ModelOptions& model, const OperationShape& shape);

}  // namespace tessera
