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

// The expert step of one MoE layer over `ep` (expert_parallel.h): buffer [E, cap, C] of this
// rank's tokens -> the outputs of their experts, [E, cap, C].
at::Tensor dispatch_and_combine(const at::Tensor& buffer, const std::function<at::Tensor(const at::Tensor&)>& experts,
                                comm::Group& ep) {
  const int64_t W = ep.size(), E = buffer.size(0), cap = buffer.size(1), C = buffer.size(2), local = E / W;
  at::Tensor caps = at::empty({W}, at::kLong);
  ep.all_gather(caps, at::full({1}, cap, at::kLong));
  std::vector<int64_t> from(static_cast<size_t>(W)), rows_in(static_cast<size_t>(W)), rows_out(static_cast<size_t>(W));
  for (int64_t i = 0; i < W; ++i) {
    from[static_cast<size_t>(i)] = caps[i].item<int64_t>();
    rows_in[static_cast<size_t>(i)] = local * from[static_cast<size_t>(i)];  // received from rank i
    rows_out[static_cast<size_t>(i)] = local * cap;                          // sent to rank i
  }
  const at::Tensor received = ExpertAllToAll::apply(buffer.reshape({E * cap, C}), &ep, rows_in, rows_out);
  std::vector<at::Tensor> sources;  // [local, cap_i, C] per rank i
  int64_t at_row = 0;
  for (int64_t i = 0; i < W; ++i) {
    sources.push_back(received.narrow(0, at_row, rows_in[static_cast<size_t>(i)]).view({local, from[static_cast<size_t>(i)], C}));
    at_row += rows_in[static_cast<size_t>(i)];
  }
  const at::Tensor out = experts(at::cat(sources, 1));  // [local, Σ cap_i, C]
  std::vector<at::Tensor> back;
  int64_t at_slot = 0;
  for (int64_t i = 0; i < W; ++i) {
    back.push_back(out.narrow(1, at_slot, from[static_cast<size_t>(i)]).reshape({rows_in[static_cast<size_t>(i)], C}));
    at_slot += from[static_cast<size_t>(i)];
  }
  return ExpertAllToAll::apply(at::cat(back, 0), &ep, rows_out, rows_in).view({E, cap, C});
}

}  // namespace

void check_expert_parallel(const Config& config, const ParallelDims& dims) {
  const int64_t ep = dims.ep();
  if (ep == 1) return;
  const ModelOptions& m = config.model;
  require(m.ffn == "moe", "parallel.ep = ", ep, " with model.ffn = ", m.ffn,
          ": expert parallelism splits the experts of MoE layers; set model.ffn = moe or parallel.ep = 1");
  require(m.moe_experts % ep == 0, "parallel.ep = ", ep, " does not divide model.moe_experts = ", m.moe_experts,
          " (each expert-parallel rank holds moe_experts / ep whole experts)");
  require(!config.memory.swap, "memory.swap = true with parallel.ep = ", ep,
          ": the swap engine trains whole replicas of the model; swapping experts split over ranks is not "
          "implemented; set parallel.ep = 1");
  require(config.parallel.grad_compression == "none", "parallel.grad_compression = ", config.parallel.grad_compression,
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
  moe.set_expert_step([&ep](const at::Tensor& buffer, const std::function<at::Tensor(const at::Tensor&)>& experts) {
    return dispatch_and_combine(buffer, experts, ep);
  });
}

void apply_expert_parallel(TransformerLM& model, comm::Group& ep) {
  for (int64_t layer : model->layers())
    if (MoE moe = model->block(layer)->moe) apply_expert_parallel(*moe, ep);
}

}  // namespace tessera
