// FlatUnit: the unit of ZeRO sharding and of ZeRO-3's home in the residency layer (sharded_home.h). A
// parameters reduced over one group (a transformer block's, or the model's ends: embeddings, final
// norm; a block with experts has a second unit for them, reduced over the expert-data-parallel
// group) is flattened, in order, into one buffer padded to a multiple of the group's size N, and
// the group's rank r owns the elements [r * S, (r + 1) * S) of it:
//
//   flat   [N * S]   entry e at [e.offset, e.offset + e.numel), zeros in the padding
//   shard  [S]       this rank's part: a view of flat (stages 1-2) or a buffer of its own (stage 3)
//
// Invariants:
// - The model's parameters are views of `flat` (installed with set_data), so they all share flat's
//   StorageImpl. release() frees that storage and materialize() gives it fresh memory of the same
//   size: every parameter, and every tensor the autograd graph saved from one (a leaf itself or a
//   view such as weight.t()), sees the new memory; gather_async() then fills it from the shards.
// - The padding is never handed to an optimizer, so it stays zero.
// - A unit may be built from parameters still on the meta device (ZeRO-3's set-up: no rank
//   materialises its whole stage): each takes its value from InitialValues into its place in
//   `flat`, one parameter at a time, and becomes a view of flat as above.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "comm/group.h"

namespace tessera {

// The values of parameters built on the meta device: `of(name)` is this rank's part of parameter
// `name`, on `where` (device and dtype), as a materialised model would hold it.
struct InitialValues {
  at::TensorOptions where;
  std::function<at::Tensor(const std::string& name)> of;
};

class FlatUnit {
 public:
  struct Entry {
    std::string name;
    at::Tensor param;  // the model's parameter, a view of flat once built
    int64_t offset = 0, numel = 0;
    bool decay = false;  // weight decay of the original parameter (decays(), optim/optimizer.h)
  };

  // Flattens `params` into `flat`, sharded over `group` (which outlives the unit), and points them
  // at it. With own_shard, `shard` is a copy that stays when `flat` is released (stage 3);
  // otherwise it is a view of flat. Parameters on the meta device take their values from
  // `initial` (required then; all of a unit's parameters are meta or none).
  FlatUnit(const std::vector<std::pair<std::string, at::Tensor>>& params, comm::Group& group, bool own_shard,
           const InitialValues* initial = nullptr);

  comm::Group& group() const { return *group_; }
  const std::vector<Entry>& entries() const { return entries_; }
  int64_t shard_numel() const { return shard_numel_; }
  int64_t padded_numel() const { return shard_numel_ * world_; }
  const at::Tensor& flat() const { return flat_; }
  const at::Tensor& shard() const { return shard_; }

  // The elements [begin, end) of entry e (in unit coordinates) that this rank owns; begin == end
  // when it owns none of them.
  std::pair<int64_t, int64_t> owned(const Entry& e) const;
  // The owned part of entry e, as a 1-D view of `of` ([S], laid out as the shard).
  at::Tensor owned_part(const Entry& e, const at::Tensor& of) const;

  // Stage 3 storage of `flat`: whether it is held (false when released).
  bool materialized() const;
  void release();
  void materialize();

  // Fills `flat` (materialized) from every rank's shard. The shard goes in as a copy where it is a
  // view of flat (the input may not alias the output), which lives until the Work is waited.
  comm::Work gather_async();

  // [N * S]: the entries' current gradients, zero where a gradient is undefined and in the padding.
  at::Tensor flatten_grads() const;

  // Whole tensors from per-rank parts: part(e) is this rank's owned part of entry e's tensor
  // (owned_part layout) or undefined when it owns none. Returns one tensor per entry, shaped like
  // the parameter, identical on every rank (a collective).
  std::vector<at::Tensor> gather_entries(const std::function<at::Tensor(const Entry&)>& part,
                                         const at::TensorOptions& options) const;

 private:
  std::vector<Entry> entries_;
  comm::Group* group_;
  int64_t world_, rank_;
  int64_t shard_numel_ = 0;
  at::Tensor flat_, shard_;
};

}  // namespace tessera
