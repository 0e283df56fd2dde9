// The sum of tensor-parallel gradient shares (gradient_shares.h).
#include "parallel/tensor/gradient_shares.h"

#include <ATen/ATen.h>

#include "core/flat_tensors.h"

namespace tessera {

void GradientShares::sum(const std::vector<at::Tensor>& shares) const {
  int64_t elements = 0;
  for (const at::Tensor& t : shares) elements += t.numel();
  if (!tp || elements == 0) return;
  at::NoGradGuard no_grad;
  at::Tensor flat = flatten_float(shares);
  tp->all_reduce(flat);
  unflatten_into(flat, shares);
}

GradientShares gradient_shares(const TransformerLM& model, comm::Group& tp, bool megatron_sp) {
  GradientShares out;
  if (tp.size() == 1) return out;
  out.tp = &tp;
  for (const auto& [name, spec] : model->parameter_specs())
    if (gradient_summed_over_tp(spec, megatron_sp)) out.names.insert(name);
  return out;
}

}  // namespace tessera
