// Expert parallelism: the refusals, the experts each rank keeps and the dispatching expert step
// (expert_parallel.h).
#include "parallel/expert/expert_parallel.h"

#include <numeric>

#include <torch/autograd.h>
#include <torch/torch.h>

#include "core/error.h"

namespace tessera {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

int64_t total(const std::vector<int64_t>& rows) { return std::accumulate(rows.begin(), rows.end(), int64_t{0}); }

// x [Σ send_rows, C] -> [Σ receive_rows, C]: send_rows[j] rows to member j, receive_rows[i] from i.
at::Tensor exchange(const at::Tensor& x, comm::Group& ep, const std::vector<int64_t>& receive_rows,
                    const std::vector<int64_t>& send_rows) {
  at::Tensor out = at::empty({total(receive_rows), x.size(1)}, x.options());
  ep.all_to_all_async(out, x.contiguous(), receive_rows, send_rows).wait();
  return out;
}

// One all-to-all; its backward is the inverse all-to-all of the gradient. Only the row counts are
// kept for backward.
struct ExpertAllToAll : public torch::autograd::Function<ExpertAllToAll> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, comm::Group* ep,
                            std::vector<int64_t> receive_rows, std::vector<int64_t> send_rows) {
    ctx->saved_data["ep"] = reinterpret_cast<int64_t>(ep);
    ctx->saved_data["receive"] = receive_rows;
    ctx->saved_data["send"] = send_rows;
    return exchange(x, *ep, receive_rows, send_rows);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto* ep = reinterpret_cast<comm::Group*>(ctx->saved_data["ep"].toInt());
    const std::vector<int64_t> receive = ctx->saved_data["receive"].toIntVector();
    const std::vector<int64_t> send = ctx->saved_data["send"].toIntVector();
    return {exchange(grad_outputs[0], *ep, send, receive), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// The expert step of one MoE layer over `ep` (expert_parallel.h): this rank's buffer [R, C], sizes[e]
// rows for each of the E experts in order -> the outputs of their experts, [R, C].
at::Tensor dispatch_and_combine(const at::Tensor& buffer, const std::vector<int64_t>& sizes,
                                const MoEImpl::ExpertFn& experts, comm::Group& ep) {
  const int64_t W = ep.size(), E = static_cast<int64_t>(sizes.size()), local = E / W, C = buffer.size(1);
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
  const at::Tensor received = ExpertAllToAll::apply(buffer, &ep, receive, send);  // source-major
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
  const at::Tensor index = at::tensor(order, at::kLong).to(buffer.device());
  const at::Tensor out = experts(received.index_select(0, index), local_sizes);
  const at::Tensor back = at::zeros({received.size(0), C}, out.options()).index_copy(0, index, out);
  return ExpertAllToAll::apply(back, &ep, send, receive);
}

}  // namespace

void check_expert_parallel(const ModelOptions& m, const ParallelOptions& parallel, const MemoryOptions& memory,
                           const ParallelDims& dims) {
  const int64_t ep = dims.ep();
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

void apply_expert_parallel(MoEImpl& moe, comm::Group& ep) {
  const int64_t W = ep.size(), r = ep.rank();
  if (W == 1) return;
  for (at::Tensor* p : {&moe.w_fc, &moe.b_fc, &moe.w_proj, &moe.b_proj}) {
    if (!p->defined()) continue;
    require(p->is_meta(), "internal: apply_expert_parallel takes a layer on the meta device");
    p->set_data(p->detach().chunk(W, 0)[static_cast<size_t>(r)].clone());
  }
  moe.set_expert_step([&ep](const at::Tensor& buffer, const std::vector<int64_t>& sizes,
                            const MoEImpl::ExpertFn& experts) { return dispatch_and_combine(buffer, sizes, experts, ep); });
}

void apply_expert_parallel(TransformerLM& model, comm::Group& ep) {
  for (int64_t layer : model->layers())
    if (MoE moe = model->block(layer)->moe) apply_expert_parallel(*moe, ep);
}

}  // namespace tessera
