// ParameterPlacement: where each parameter of the model lives under this rank's layout, and the
// one routine between a whole tensor and this rank's part of it, for parameters and for the state
// kept per parameter (optimizer slots, fp16 master weights). ParallelModel (parallelize.h) goes through it
// for materialisation, loading, saving, export, the gradient observer and optimizer-state
// checkpoints.
//
// What decides a placement is declared, never read from a name: each parameter's
// ParameterSpec (model/parameter_spec.h) gives its split, its block (hence its pipeline stage, by
// the layout's cut) and whether it is the tied embedding. The layers:
//   tp   part(name, whole) cuts the rank's shard by the declared split; whole(name, part)
//        all-gathers it back (a collective of tp when split, the tensor itself otherwise); a
//        chunk held by several tp ranks (replicated key/value heads: replicas()) is one part;
//        part_region(name) describes the part as a region of the whole tensor, so a checkpoint
//        holds and reads parts without gathering them;
//   ep   the same for the stacked expert weights (Split::expert): dim 0 cut over the ep group
//        (parallel/expert/expert_parallel.h); a parameter is split over one group at most
//        (split_group(): tp, ep, or none);
//   pp   holder(name) is the pipeline rank holding a parameter of the whole model (the tied
//        embedding: the first stage's), writes(name) whether this rank writes it (not the last
//        stage's copy of the tied embedding), over_stages() assembles the whole model's tensors
//        from the stages (a collective of pp);
//   ZeRO the owner keeps (protocols/optimizer_owner.h): its flat shards span parameters, so it
//        makes them whole over the data replicas itself, a unit per collective
//        (visit_full_parameters, gradients(), training_state()), and names its parts as ranges of
//        its local tensors; state_region(state, slice) places such a range in the whole tensor,
//        through the tp or ep part, for checkpoints.
// State tensors are named by their owner: "optim.<param>.<slot>" and "master.<param>" belong to
// <param> (parameter_of() reads that from the name for the placement, through the optimizer's own
// parameter_of_state(), which DataParallel's stage-0 optimizer_state_slices() also uses); others (the loss
// scaler's "scaler.*", a step counter kept as a scalar) belong to no parameter and are replicated.
//
// Invariants: a ParameterPlacement is made once per ParallelModel from the rank's model (built for
// its stages) and the layout, and never changes; every rank of a tp or ep group holds the same
// names.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "checkpoint/region.h"
#include "comm/group.h"
#include "model/transformer.h"
#include "parallel/tensor/tensor_parallel.h"
#include "plan/layout.h"

namespace tessera {

class ParameterPlacement {
 public:
  // `model`: this rank's (its stages); `tp`, `pp`, `ep`: its groups, or null without that
  // parallelism.
  ParameterPlacement(const TransformerLM& model, const Layout& layout, comm::Group* tp, comm::Group* pp,
                     comm::Group* ep = nullptr);

  // Parameters of this rank's model.
  // The group its parameter is split over (tp or ep), or null when this rank holds it whole.
  comm::Group* split_group(const std::string& param) const;
  at::Tensor part(const std::string& param, const at::Tensor& whole) const;
  at::Tensor whole(const std::string& param, const at::Tensor& part) const;
  bool writes(const std::string& param) const;
  // The region (checkpoint/region.h) of the whole parameter this rank's part is: its tensor- or
  // expert-parallel chunk when split, the whole tensor otherwise. A checkpoint writes and reads
  // parts by it.
  Region part_region(const std::string& param) const;
  // How many ranks of its split group hold the same part as this rank: 1, or N / K for the
  // key/value projection of K heads replicated over tp = N (tensor_parallel.h). Of those, the
  // first writes it to checkpoints.
  int64_t replicas(const std::string& param) const;

  // State tensors ("optim.<param>.<slot>", "master.<param>", or none).
  std::string parameter_of(const std::string& state) const;
  // The group state tensor `state` (of its parameter's part's shape) is split over: its
  // parameter's, or null (replicated, a scalar, or no parameter).
  comm::Group* state_split_group(const std::string& state, const std::vector<int64_t>& shape) const;
  at::Tensor state_part(const std::string& state, const at::Tensor& whole) const;
  at::Tensor state_whole(const std::string& state, const at::Tensor& part) const;
  // The region of the whole state tensor that this rank's `state`, of shape `local`, is (its
  // parameter's part when split).
  Region state_region(const std::string& state, const std::vector<int64_t>& local) const;
  // The region of the whole state tensor that `slice` is, a region of this rank's `state` tensor
  // (all of it, or a ZeRO owner's range of it): the same range of the rank's part when split.
  Region state_region(const std::string& state, const Region& slice) const;
  // Whether this rank keeps (and writes) state tensor `state`: under pp its stage's and those of
  // no parameter; writes_state as writes() for its parameter.
  bool keeps_state(const std::string& state) const;
  bool writes_state(const std::string& state) const;

  // Under pp: the pipeline rank holding parameter `param` of the whole model, and every parameter
  // of the whole model in its order, float32, each broadcast over pp by its holder from
  // mine(name) (a collective of pp).
  int64_t holder(const std::string& param) const;
  // Every parameter of the whole model, in its order, with its whole (unsplit) shape.
  const std::vector<std::pair<std::string, std::vector<int64_t>>>& whole_shapes() const { return whole_shapes_; }
  const std::vector<int64_t>& whole_shape(const std::string& param) const { return whole_shapes_[position_.at(param)].second; }
  NamedTensors over_stages(const std::function<at::Tensor(const std::string& param)>& mine) const;

 private:
  // How a parameter is cut: along `layout` over `group`, or not (group null).
  struct Cut {
    TensorParallelLayout layout;
    comm::Group* group = nullptr;
    int64_t index() const { return layout.chunk(group->rank()); }  // this rank's chunk
    int64_t count() const { return layout.chunks(group->size()); }
  };
  Cut cut(const std::string& param) const;
  // The cut of state tensor `state` of `shape`: its parameter's, or none.
  Cut state_cut(const std::string& state, const std::vector<int64_t>& shape) const;

  TransformerLM model_;
  const Layout& layout_;
  comm::Group* tp_;
  comm::Group* pp_;
  comm::Group* ep_;
  std::map<std::string, ParameterSpec> whole_specs_;  // the whole model's, for holder()
  std::vector<std::pair<std::string, std::vector<int64_t>>> whole_shapes_;  // in the whole model's order
  std::map<std::string, size_t> position_;                                  // in whole_shapes_
};

}  // namespace tessera
