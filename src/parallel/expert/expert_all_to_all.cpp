// The expert all-to-alls (expert_all_to_all.h).
#include "parallel/expert/expert_all_to_all.h"

#include <numeric>

#include <torch/autograd.h>
#include <torch/autograd.h>

namespace tessera {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

int64_t total_rows(const std::vector<int64_t>& rows) { return std::accumulate(rows.begin(), rows.end(), int64_t{0}); }

struct ExpertAllToAll : public torch::autograd::Function<ExpertAllToAll> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, comm::Group* ep,
                            std::vector<int64_t> receive_rows, std::vector<int64_t> send_rows) {
    ctx->saved_data["ep"] = reinterpret_cast<int64_t>(ep);
    ctx->saved_data["receive"] = receive_rows;
    ctx->saved_data["send"] = send_rows;
    return exchange_rows(x, *ep, receive_rows, send_rows);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto* ep = reinterpret_cast<comm::Group*>(ctx->saved_data["ep"].toInt());
    const std::vector<int64_t> receive = ctx->saved_data["receive"].toIntVector();
    const std::vector<int64_t> send = ctx->saved_data["send"].toIntVector();
    return {exchange_rows(grad_outputs[0], *ep, send, receive), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor exchange_rows(const at::Tensor& x, comm::Group& ep, const std::vector<int64_t>& receive_rows,
                         const std::vector<int64_t>& send_rows) {
  std::vector<int64_t> shape = x.sizes().vec();
  shape[0] = total_rows(receive_rows);
  at::Tensor out = at::empty(shape, x.options());
  ep.all_to_all_async(out, x.contiguous(), receive_rows, send_rows).wait();
  return out;
}

at::Tensor expert_all_to_all(const at::Tensor& x, comm::Group& ep, const std::vector<int64_t>& receive_rows,
                             const std::vector<int64_t>& send_rows) {
  return ExpertAllToAll::apply(x, &ep, receive_rows, send_rows);
}

std::vector<int64_t> rows_to_receive(comm::Group& ep, const std::vector<int64_t>& send_rows) {
  const at::Tensor out = at::empty({ep.size()}, at::kLong);
  ep.all_to_all(out, at::tensor(send_rows, at::kLong));
  return {out.data_ptr<int64_t>(), out.data_ptr<int64_t>() + ep.size()};
}

}  // namespace tessera
