// The sums of tensor-parallel gradient shares (gradient_shares.h).
#include "parallel/tensor/gradient_shares.h"

#include <ATen/ATen.h>

#include "core/error.h"
#include "core/flat_tensors.h"
#include "parallel/tensor/tensor_parallel.h"

namespace tessera {

bool GradientShares::holds(const std::string& name) const {
  for (const Sum& s : sums)
    if (s.names.count(name)) return true;
  return false;
}

void GradientShares::sum(const std::vector<std::pair<std::string, at::Tensor>>& shares) const {
  at::NoGradGuard no_grad;
  for (const Sum& s : sums) {
    std::vector<at::Tensor> parts;
    int64_t elements = 0;
    for (const auto& [name, t] : shares)
      if (s.names.count(name)) {
        parts.push_back(t);
        elements += t.numel();
      }
    if (elements == 0) continue;
    at::Tensor flat = flatten_float(parts);
    s.group->all_reduce(flat);
    unflatten_into(flat, parts);
  }
}

GradientShares gradient_shares(const TransformerLM& model, comm::Group& tp, bool megatron_sp, comm::Group* kv_replicas) {
  GradientShares out;
  if (tp.size() == 1) return out;
  GradientShares::Sum over_tp{&tp, {}}, over_kv{kv_replicas, {}};
  for (const auto& [name, spec] : model->parameter_specs()) {
    if (gradient_summed_over_tp(spec, megatron_sp)) over_tp.names.insert(name);
    const int64_t replicas = tensor_parallel_layout(spec, tp.size()).replicas;
    if (replicas > 1) {
      require(kv_replicas && kv_replicas->size() == replicas, "internal: gradient_shares needs the group of the ",
              replicas, " tp ranks sharing ", name, " (kv_replica_ranks)");
      over_kv.names.insert(name);
    }
  }
  if (!over_tp.names.empty()) out.sums.push_back(std::move(over_tp));
  if (!over_kv.names.empty()) out.sums.push_back(std::move(over_kv));
  return out;
}

}  // namespace tessera
