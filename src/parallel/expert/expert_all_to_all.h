// The all-to-alls that carry tokens to their experts' ranks and back (parallel/expert/): rows of a
// tensor sent to the members of the "ep" group with variable counts.
//
// Invariant: every member calls them in the same order with pairwise-agreeing counts (member i's
// send_rows[j] == member j's receive_rows[i]), forward, recomputation and backward alike.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "comm/group.h"

namespace tessera {

// x [Σ send_rows, ...] -> [Σ receive_rows, ...]: the first send_rows[0] rows to member 0, the next
// send_rows[1] to member 1, ...; receive_rows[i] rows from member i, in member order. Not
// differentiable (routing metadata).
at::Tensor exchange_rows(const at::Tensor& x, comm::Group& ep, const std::vector<int64_t>& receive_rows,
                         const std::vector<int64_t>& send_rows);

// The same, differentiable: the gradient goes back by the inverse exchange (only the counts are
// kept for backward, no tensors).
at::Tensor expert_all_to_all(const at::Tensor& x, comm::Group& ep, const std::vector<int64_t>& receive_rows,
                             const std::vector<int64_t>& send_rows);

// How many rows each member sends this one: every member's send_rows[me] (one all-to-all of one
// integer per member).
std::vector<int64_t> rows_to_receive(comm::Group& ep, const std::vector<int64_t>& send_rows);

}  // namespace tessera
