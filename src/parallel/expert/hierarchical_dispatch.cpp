// Hierarchical expert dispatch (hierarchical_dispatch.h).
#include "parallel/expert/hierarchical_dispatch.h"

#include <algorithm>
#include <functional>
#include <map>

#include <ATen/ATen.h>

#include "core/error.h"
#include "parallel/expert/expert_all_to_all.h"

namespace tessera {
namespace {

// Tokens held by a rank at one stage of the dispatch: rows [n, C + k] (x, then the k gates) and
// each row's k expert ids (-1: none), on the host.
struct Table {
  at::Tensor rows;
  std::vector<int32_t> ids;
  int64_t size() const { return rows.size(0); }
};

// One hop: counts per member each way, and for each row sent the row of the sender's table it copies.
struct Hop {
  bool identity = false;
  std::vector<int64_t> send, receive, source;
};

at::Tensor long_tensor(const std::vector<int64_t>& v, const at::Device& device) {
  return at::tensor(v, at::kLong).to(device);
}

// Sends each row of `in` once to each member that `destination` names for one of its choices,
// with the ids restricted to that member's; the rows come in member order, each sender's in its
// table's order.
Table forward_hop(const Table& in, int64_t k, comm::Group& ep, const std::function<int64_t(int32_t)>& destination,
                  Hop& hop) {
  const int64_t W = ep.size();
  std::vector<std::vector<int64_t>> rows(static_cast<size_t>(W));
  std::vector<std::vector<int32_t>> ids(static_cast<size_t>(W));
  std::vector<int64_t> to(static_cast<size_t>(k));
  for (int64_t t = 0; t < in.size(); ++t) {
    const int32_t* choice = in.ids.data() + t * k;
    for (int64_t c = 0; c < k; ++c) to[static_cast<size_t>(c)] = choice[c] < 0 ? -1 : destination(choice[c]);
    for (int64_t c = 0; c < k; ++c) {
      const int64_t j = to[static_cast<size_t>(c)];
      if (j < 0 || std::find(to.begin(), to.begin() + c, j) != to.begin() + c) continue;  // first choice for j
      rows[static_cast<size_t>(j)].push_back(t);
      for (int64_t d = 0; d < k; ++d) ids[static_cast<size_t>(j)].push_back(to[static_cast<size_t>(d)] == j ? choice[d] : -1);
    }
  }
  hop.send.assign(static_cast<size_t>(W), 0);
  std::vector<int32_t> sent_ids;
  for (int64_t j = 0; j < W; ++j) {
    hop.send[static_cast<size_t>(j)] = static_cast<int64_t>(rows[static_cast<size_t>(j)].size());
    hop.source.insert(hop.source.end(), rows[static_cast<size_t>(j)].begin(), rows[static_cast<size_t>(j)].end());
    sent_ids.insert(sent_ids.end(), ids[static_cast<size_t>(j)].begin(), ids[static_cast<size_t>(j)].end());
  }
  hop.receive = rows_to_receive(ep, hop.send);
  const at::Tensor id_tensor =
      at::from_blob(sent_ids.data(), {static_cast<int64_t>(hop.source.size()), k}, at::kInt).clone();
  const at::Tensor received_ids = exchange_rows(id_tensor, ep, hop.receive, hop.send).contiguous();
  Table out;
  out.ids.assign(received_ids.data_ptr<int32_t>(), received_ids.data_ptr<int32_t>() + received_ids.numel());
  out.rows = expert_all_to_all(in.rows.index_select(0, long_tensor(hop.source, in.rows.device())), ep, hop.receive,
                               hop.send);
  return out;
}

// The inverse of `hop` for outputs: partial [rows received, C] -> [rows of the sender's table, C],
// the copies of a row summed.
at::Tensor combine_hop(const at::Tensor& partial, const Hop& hop, int64_t table_rows, comm::Group& ep) {
  if (hop.identity) return partial;
  const at::Tensor back = expert_all_to_all(partial, ep, hop.send, hop.receive);
  return at::zeros({table_rows, partial.size(1)}, partial.options())
      .index_add(0, long_tensor(hop.source, partial.device()), back);
}

// The member's experts on the tokens it holds: one row per choice of its experts (ids in
// [first, first + local)), grouped by expert, weighted by the gates, summed per token -> [n, C].
at::Tensor run_experts(const Table& held, int64_t k, int64_t C, int64_t first, int64_t local,
                       const MoEImpl::ExpertFn& experts) {
  std::vector<std::vector<int64_t>> row_of(static_cast<size_t>(local)), gate_of(static_cast<size_t>(local));
  for (int64_t t = 0; t < held.size(); ++t)
    for (int64_t c = 0; c < k; ++c) {
      const int32_t e = held.ids[static_cast<size_t>(t * k + c)];
      if (e < 0) continue;
      require(e >= first && e < first + local, "internal: expert ", e, " reached the member holding experts [",
              first, ", ", first + local, ")");
      row_of[static_cast<size_t>(e - first)].push_back(t);
      gate_of[static_cast<size_t>(e - first)].push_back(t * k + c);
    }
  std::vector<int64_t> rows, gates, sizes;
  for (int64_t l = 0; l < local; ++l) {
    rows.insert(rows.end(), row_of[static_cast<size_t>(l)].begin(), row_of[static_cast<size_t>(l)].end());
    gates.insert(gates.end(), gate_of[static_cast<size_t>(l)].begin(), gate_of[static_cast<size_t>(l)].end());
    sizes.push_back(static_cast<int64_t>(row_of[static_cast<size_t>(l)].size()));
  }
  const at::Device device = held.rows.device();
  const at::Tensor row_index = long_tensor(rows, device);
  const at::Tensor out = experts(held.rows.narrow(1, 0, C).index_select(0, row_index), sizes);
  const at::Tensor gate = held.rows.narrow(1, C, k).reshape({-1}).index_select(0, long_tensor(gates, device));
  return at::zeros({held.size(), C}, out.options())
      .index_add(0, row_index, out * gate.to(out.scalar_type()).unsqueeze(1));
}

}  // namespace

at::Tensor hierarchical_dispatch(const at::Tensor& x, const MoERouting& r, const MoEImpl::ExpertFn& experts,
                                 comm::Group& ep, const std::vector<int64_t>& node_of_member) {
  const int64_t W = ep.size(), me = ep.rank(), N = x.size(0), C = x.size(1), k = r.expert.size(1);
  const int64_t E = static_cast<int64_t>(r.sizes.size()), local = E / W;
  // The members of each node, and this rank's position among its node's.
  std::map<int64_t, std::vector<int64_t>> members;
  for (int64_t j = 0; j < W; ++j) members[node_of_member[static_cast<size_t>(j)]].push_back(j);
  const int64_t my_node = node_of_member[static_cast<size_t>(me)];
  const auto& mine = members[my_node];
  const int64_t position = std::find(mine.begin(), mine.end(), me) - mine.begin();
  size_t largest_node = 0;
  for (const auto& [node, on_node] : members) largest_node = std::max(largest_node, on_node.size());
  const auto member_of = [local](int32_t expert) { return static_cast<int64_t>(expert) / local; };

  // This rank's tokens: x and the gates, and the kept choices' experts (-1 for a dropped one).
  Table tokens;
  tokens.rows = at::cat({x, r.gate.to(x.scalar_type())}, 1);
  const at::Tensor kept_expert = at::where(r.row < r.rows(), r.expert, -1).to(at::kCPU, at::kInt).contiguous();
  tokens.ids.assign(kept_expert.data_ptr<int32_t>(), kept_expert.data_ptr<int32_t>() + N * k);

  Hop between, within;
  Table proxied = tokens;
  if (members.size() > 1) {
    proxied = forward_hop(tokens, k, ep, [&](int32_t expert) {
      const int64_t node = node_of_member[static_cast<size_t>(member_of(expert))];
      if (node == my_node) return me;
      const auto& there = members.at(node);
      return there[static_cast<size_t>(position % static_cast<int64_t>(there.size()))];
    }, between);
  } else {
    between.identity = true;
  }
  Table held = proxied;
  if (largest_node > 1) held = forward_hop(proxied, k, ep, member_of, within);
  else within.identity = true;

  const at::Tensor partial = run_experts(held, k, C, me * local, local, experts);
  const at::Tensor at_proxy = combine_hop(partial, within, proxied.size(), ep);
  return combine_hop(at_proxy, between, N, ep);
}

}  // namespace tessera
