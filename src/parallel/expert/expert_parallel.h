// Expert parallelism (parallel.ep): each MoE layer's experts split over the ranks of an "ep" group
// (ep consecutive data-parallel coordinates, core/parallel_dims.h), tokens carried to their experts
// and back by all-to-all (GShard; Megatron-Core's all-to-all dispatcher).
//
// Rank j of the group holds experts [j E/ep, (j+1) E/ep) of every MoE layer: its part of the
// stacked expert weights (Split::expert, dim 0; ParameterPlacement cuts and joins it). Each rank
// routes its own tokens over all E experts exactly as one process would (model/moe.h: this rank's
// buffer [R, C], sizes[e] rows for expert e: its capacity, or under dropless routing its count),
// then the layer's routed step (MoEImpl::set_routed_step), by parallel.ep_dispatch:
// alltoall (this file; GShard's, Megatron-Core's all-to-all dispatcher), one row per routed choice:
//   sizes     every rank's sizes [E] travel first (one all-gather of E integers);
//   dispatch  one all-to-all with variable splits: the buffer's rows of rank j's experts (one
//             contiguous run) go to rank j; rank j regroups what it received by expert (each local
//             expert's rows from rank 0, 1, ...) and runs its experts once over them;
//   combine   the rows go back to source order and the inverse all-to-all returns each source's
//             outputs to it, [R, C], which the routed step weights by the gates;
// hierarchical (hierarchical_dispatch.h; DeepSeek-V3's): each token once per node and then once per
// rank, the gates applied where the experts run.
// Under dropless routing only routed rows travel (tokens x k per rank, nothing padded). A rank
// whose tokens all go elsewhere, or to which none come, sends or receives zero rows; its experts
// still run (on no rows) and get a zero gradient.
//
// Every all-to-all of tokens is one autograd function (expert_all_to_all.h) whose backward is the
// inverse all-to-all of the gradient, keeping only the row counts (no tensors): an expert's
// gradient on rank j sums the contributions of every token of its ep group that chose it.
// DataParallel then sums it over the expert's replicas (the "edp" group) and divides by the number
// of data replicas, which makes it the one-process mean (parallel/data/data_parallel.h).
//
// Invariants: every rank of an ep group runs the same MoE layers in the same order (forward,
// recomputation under activation checkpointing, backward): the collectives need it, and every
// layout that trains replicas of one schedule does so. The all-to-alls run on the "ep" group,
// which comm::Mesh shares with no other dimension, so they never queue behind gradient buckets.
#pragma once

#include "comm/group.h"
#include "core/parallel_dims.h"
#include "core/parallel_options.h"
#include "core/run_options.h"
#include "model/transformer.h"

namespace tessera {

// Refuses, naming the keys, what expert parallelism cannot run: ep > 1 without MoE layers, ep not
// dividing model.moe_experts, and the combinations not built.
void check_expert_parallel(const ModelOptions& model, const ParallelOptions& parallel, const MemoryOptions& memory,
                           const ParallelDims& dims);

// parallel.ep_dispatch, and the node of each member of the ep group (global rank / ranks per node).
struct ExpertDispatch {
  bool hierarchical = false;
  std::vector<int64_t> node_of_member;
};

// parallel.ep_dispatch, and each member's node: global rank / parallel.ranks_per_node, or with 0
// the launcher's processes per node (LOCAL_WORLD_SIZE; 1 where no launcher says).
ExpertDispatch expert_dispatch(const ParallelOptions& parallel, const comm::Group& ep);

// Keeps this rank's experts of every MoE layer of `model` (on the meta device: the parameters are
// materialised later, by their placement), installs the dispatching routed step over `ep` and
// tells `ep` its members' nodes (its inter-node byte count).
void apply_expert_parallel(TransformerLM& model, comm::Group& ep, const ExpertDispatch& dispatch);
// The same for one MoE layer (on the meta device).
void apply_expert_parallel(MoEImpl& moe, comm::Group& ep, const ExpertDispatch& dispatch);

}  // namespace tessera
