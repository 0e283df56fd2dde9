// Expert parallelism: the refusals, the experts each rank keeps and the dispatching routed step
// (expert_parallel.h).
#include "parallel/expert/expert_parallel.h"

#include <ATen/ATen.h>

#include "comm/rendezvous.h"
#include "core/error.h"
#include "parallel/expert/expert_all_to_all.h"
#include "parallel/expert/hierarchical_dispatch.h"

namespace tessera {
namespace {

// parallel.ep_dispatch = alltoall over `ep` (expert_parallel.h): this rank's buffer [R, C], sizes[e]
// rows for each of the E experts in order -> the outputs of their experts, [R, C].
at::Tensor dispatch_and_combine(const at::Tensor& buffer, const std::vector<int64_t>& sizes,
                                const MoEImpl::ExpertFn& experts, comm::Group& ep) {
  const int64_t W = ep.size(), E = static_cast<int64_t>(sizes.size()), local = E / W;
  // Every rank's sizes: all[i][e] rows of expert e in rank i's buffer.
  at::Tensor gathered = at::empty({W * E}, at::kLong);
  ep.all_gather(gathered, at::tensor(sizes, at::kLong));
  const int64_t* all = gathered.data_ptr<int64_t>();
  auto size_of = [&](int64_t rank, int64_t expert) { return all[rank * E + expert]; };
  // Rows to rank j: this rank's rows of j's experts (contiguous); rows from rank i: i's rows of mine.
  const int64_t me = ep.rank();
  std::vector<int64_t> send(static_cast<size_t>(W), 0), receive(static_cast<size_t>(W), 0);
  for (int64_t j = 0; j < W; ++j)
    for (int64_t l = 0; l < local; ++l) {
      send[static_cast<size_t>(j)] += size_of(me, j * local + l);
      receive[static_cast<size_t>(j)] += size_of(j, me * local + l);
    }
  const at::Tensor received = expert_all_to_all(buffer, ep, receive, send);  // source-major
  // Regroup expert-major (each local expert's rows from rank 0, 1, ...) and back: `received` holds
  // the sources one after the other, each its rows of this rank's experts in expert order.
  std::vector<int64_t> order, local_sizes(static_cast<size_t>(local), 0);
  for (int64_t l = 0; l < local; ++l) {
    int64_t source_start = 0;
    for (int64_t i = 0; i < W; ++i) {
      int64_t first = source_start;
      for (int64_t m = 0; m < l; ++m) first += size_of(i, me * local + m);
      const int64_t n = size_of(i, me * local + l);
      for (int64_t row = first; row < first + n; ++row) order.push_back(row);
      local_sizes[static_cast<size_t>(l)] += n;
      source_start += receive[static_cast<size_t>(i)];
    }
  }
  // `order` is a permutation of the received rows; back to source order by its inverse, an
  // index_select, which keeps no tensor for its backward (index_copy kept the experts' output).
  std::vector<int64_t> inverse(order.size());
  for (size_t k = 0; k < order.size(); ++k) inverse[static_cast<size_t>(order[k])] = static_cast<int64_t>(k);
  const at::Tensor out = experts(received.index_select(0, at::tensor(order, at::kLong).to(buffer.device())), local_sizes);
  const at::Tensor back = out.index_select(0, at::tensor(inverse, at::kLong).to(buffer.device()));
  return expert_all_to_all(back, ep, send, receive);
}

}  // namespace

void check_expert_parallel(const ModelOptions& m, const ParallelOptions& parallel, const MemoryOptions& memory,
                           const ParallelDims& dims) {
  const int64_t ep = dims.ep();
  require(parallel.ep_dispatch == "alltoall" || ep > 1, "parallel.ep_dispatch = ", parallel.ep_dispatch,
          " with parallel.ep = 1: there is no expert dispatch; set parallel.ep > 1 or leave ep_dispatch alltoall");
  if (ep == 1) return;
  require(m.ffn == "moe", "parallel.ep = ", ep, " with model.ffn = ", m.ffn,
          ": expert parallelism splits the experts of MoE layers; set model.ffn = moe or parallel.ep = 1");
  require(m.moe_experts % ep == 0, "parallel.ep = ", ep, " does not divide model.moe_experts = ", m.moe_experts,
          " (each expert-parallel rank holds moe_experts / ep whole experts)");
  require(!memory.swap, "memory.swap = true with parallel.ep = ", ep,
          ": the swap engine trains whole replicas of the model; swapping experts split over ranks is not "
          "implemented; set parallel.ep = 1");
  require(parallel.grad_compression == "none", "parallel.grad_compression = ", parallel.grad_compression,
          " with parallel.ep = ", ep, ": the compressors keep their state over one reduction group, and experts "
          "reduce over another; use none");
}

ExpertDispatch expert_dispatch(const ParallelOptions& parallel, const comm::Group& ep) {
  const int64_t per_node = comm::processes_per_node(parallel.ranks_per_node);
  ExpertDispatch dispatch;
  dispatch.hierarchical = parallel.ep_dispatch == "hierarchical";
  for (int64_t j = 0; j < ep.size(); ++j) dispatch.node_of_member.push_back(ep.global_rank_of(j) / per_node);
  return dispatch;
}

void apply_expert_parallel(MoEImpl& moe, comm::Group& ep, const ExpertDispatch& dispatch) {
  const int64_t W = ep.size(), r = ep.rank();
  if (W == 1) return;
  for (at::Tensor* p : {&moe.w_fc, &moe.b_fc, &moe.w_proj, &moe.b_proj}) {
    if (!p->defined()) continue;
    require(p->is_meta(), "internal: apply_expert_parallel takes a layer on the meta device");
    p->set_data(p->detach().chunk(W, 0)[static_cast<size_t>(r)].clone());
  }
  if (dispatch.hierarchical) {
    moe.set_routed_step([&ep, nodes = dispatch.node_of_member](const at::Tensor& x, const MoERouting& r,
                                                              const MoEImpl::ExpertFn& experts) {
      return hierarchical_dispatch(x, r, experts, ep, nodes);
    });
    return;
  }
  moe.set_routed_step([&ep, &moe](const at::Tensor& x, const MoERouting& r, const MoEImpl::ExpertFn& experts) {
    return moe.combine(dispatch_and_combine(moe.dispatch(x, r), r.sizes, experts, ep), r);
  });
}

void apply_expert_parallel(TransformerLM& model, comm::Group& ep, const ExpertDispatch& dispatch) {
  require(static_cast<int64_t>(dispatch.node_of_member.size()) == ep.size(), "internal: ",
          dispatch.node_of_member.size(), " member nodes for an ep group of ", ep.size());
  ep.set_member_nodes(dispatch.node_of_member);
  for (int64_t layer : model->layers())
    if (MoE moe = model->block(layer)->moe) apply_expert_parallel(*moe, ep, dispatch);
}

}  // namespace tessera
