// FlatUnit: flattening, shard views, storage release and the gathers of a ZeRO unit (flat_unit.h).
#include "memory/residency/flat_unit.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <c10/core/StorageImpl.h>

#include "core/error.h"
#include "memory/storage.h"
#include "optim/optimizer.h"

namespace tessera {

FlatUnit::FlatUnit(const std::vector<std::pair<std::string, at::Tensor>>& params, comm::Group& group, bool own_shard,
                   const InitialValues* initial)
    : group_(&group), world_(group.size()), rank_(group.rank()) {
  require(!params.empty(), "internal: a ZeRO unit without parameters");
  const bool meta = params[0].second.is_meta();
  require(!meta || initial, "internal: a ZeRO unit of meta parameters without their initial values");
  const at::TensorOptions options = meta ? initial->where : params[0].second.options();
  int64_t total = 0;
  for (const auto& [name, param] : params) {
    const bool alike = meta || (param.scalar_type() == options.dtype() && param.device() == options.device());
    require(param.is_meta() == meta && alike, "internal: ZeRO unit mixes dtypes, devices or meta parameters (", name, ")");
    entries_.push_back({name, param, total, param.numel(), decays(param)});
    total += param.numel();
  }
  shard_numel_ = (total + world_ - 1) / world_;
  at::NoGradGuard no_grad;
  flat_ = at::zeros({padded_numel()}, options.requires_grad(false));
  for (auto& e : entries_) {
    at::Tensor view = flat_.narrow(0, e.offset, e.numel);
    if (meta) {
      const at::Tensor value = initial->of(e.name);
      require(value.numel() == e.numel, "internal: the initial value of '", e.name, "' has ", value.numel(),
              " elements, the parameter ", e.numel);
      view.copy_(value.reshape(-1));
      materialize_meta_parameter(e.param, view.view(e.param.sizes()));
    } else {
      view.copy_(e.param.reshape(-1));
      e.param.set_data(view.view(e.param.sizes()));
    }
  }
  shard_ = flat_.narrow(0, rank_ * shard_numel_, shard_numel_);
  if (own_shard) shard_ = shard_.clone();
}

std::pair<int64_t, int64_t> FlatUnit::owned(const Entry& e) const {
  const int64_t begin = std::max(e.offset, rank_ * shard_numel_);
  const int64_t end = std::min(e.offset + e.numel, (rank_ + 1) * shard_numel_);
  return begin < end ? std::make_pair(begin, end) : std::make_pair(begin, begin);
}

at::Tensor FlatUnit::owned_part(const Entry& e, const at::Tensor& of) const {
  const auto [begin, end] = owned(e);
  return of.narrow(0, begin - rank_ * shard_numel_, end - begin);
}

bool FlatUnit::materialized() const { return storage_materialized(flat_); }


void FlatUnit::release() { release_storage(flat_); }

void FlatUnit::materialize() { materialize_storage(flat_, static_cast<size_t>(padded_numel()) * flat_.element_size()); }

comm::Work FlatUnit::gather_async() {
  require(materialized(), "internal: gathering a released ZeRO unit");
  const bool aliases = shard_.is_alias_of(flat_);
  return group_->all_gather_async(flat_, aliases ? shard_.clone() : shard_);
}

at::Tensor FlatUnit::flatten_grads() const {
  at::Tensor out = at::zeros({padded_numel()}, flat_.options());
  for (const auto& e : entries_) {
    const at::Tensor& grad = e.param.grad();
    if (grad.defined()) out.narrow(0, e.offset, e.numel).copy_(grad.reshape(-1));
  }
  return out;
}

std::vector<at::Tensor> FlatUnit::gather_entries(const std::function<at::Tensor(const Entry&)>& part,
                                                 const at::TensorOptions& options) const {
  at::Tensor mine = at::zeros({shard_numel_}, options);
  for (const auto& e : entries_) {
    at::Tensor p = part(e);
    if (p.defined()) owned_part(e, mine).copy_(p);
  }
  at::Tensor whole = at::empty({padded_numel()}, options);
  group_->all_gather(whole, mine);
  std::vector<at::Tensor> out;
  for (const auto& e : entries_) out.push_back(whole.narrow(0, e.offset, e.numel).view(e.param.sizes()));
  return out;
}

}  // namespace tessera
