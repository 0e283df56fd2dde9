// Hierarchical expert dispatch (parallel.ep_dispatch = hierarchical; DeepSeek-V3's node-limited
// dispatch, DeepEP's inter-node kernels): a token crosses to another node at most once per node
// holding one of its experts, and reaches a rank at most once, however many of that rank's experts
// it chose.
//
// The ep group's members lie on nodes (node_of_member: global rank / parallel.ranks_per_node);
// member m holds experts [m L, (m+1) L), L = E / ep. For one MoE layer, with this rank's tokens
// x [N, C] and their routing r (each kept choice: an expert and its gate):
//   hop 1 (between nodes): each token goes once to each node holding one of its kept choices, to
//     that node's proxy for this rank: the member whose position among its node's members is this
//     rank's position among its own (modulo that node's count); for this rank's own node the proxy
//     is this rank (the copy stays local). Skipped when the group lies on one node.
//   hop 2 (within a node): each proxy sends each token it holds once to each member of its node
//     holding one of the token's choices. Skipped when every node has one member.
//   experts: a member expands each token it received into one row per choice of its own experts,
//     runs them (rows grouped by expert), weights each output by its gate and sums a token's rows:
//     one partial output per token received;
//   combine: the inverse of hop 2 returns the partial outputs to the proxies, which sum each
//     token's; the inverse of hop 1 returns those to the token's rank, which sums them into
//     y [N, C] = Σ_k gate * expert(x): the one-process routed output up to summation order.
// A token travels as one row: x and its k gates in x's dtype (one process rounds the gates to the
// experts' output dtype, and so does the member that applies them). Its k expert ids travel
// beside it as int32, -1 where the choice is not the receiver's or was dropped (not
// differentiable); each hop first exchanges its row counts. Every token exchange is
// expert_all_to_all, so a token's gradient is summed where its copies were made.
// With group-limited routing whose groups are the nodes (model.moe_groups = the nodes the ep group
// spans, node-contiguous members, so that group g's experts are node g's), a token reaches at most
// model.moe_topk_groups nodes (test_expert_parallel.cpp counts the bytes).
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "comm/group.h"
#include "model/moe.h"

namespace tessera {

// The routed step (MoEImpl::RoutedStep) over `ep`: x [N, C] routed by r -> [N, C].
at::Tensor hierarchical_dispatch(const at::Tensor& x, const MoERouting& r, const MoEImpl::ExpertFn& experts,
                                 comm::Group& ep, const std::vector<int64_t>& node_of_member);

}  // namespace tessera
