// ParallelDims: the process mesh as pure arithmetic. It resolves the [parallel] degrees against
// the world size (refusing, by key, any that do not multiply to it) and maps ranks to mesh
// coordinates and back. comm::Mesh (comm/mesh.h) builds one process group per line of the mesh.
//
// Layout, tensor parallelism innermost so that TP neighbours share a host:
//   rank = ((pp_i * dp + dp_i) * sp + sp_i) * tp + tp_i
// Groups (each a list of global ranks, ascending):
//   "tp", "sp", "dp", "pp": ranks that differ only in that coordinate;
//   "dp_sp": ranks that differ in dp and sp (gradient reduction when sp > 1);
//   "ep": ep consecutive dp coordinates with the same pp, sp, tp (ep divides dp): the ranks that
//         split the experts between them (a rank's expert coordinate is dp_i % ep);
//   "edp": the expert-data-parallel group, ranks with the same pp, sp, tp and expert coordinate
//         (dp / ep of them): they hold the same experts and average those gradients;
//   "edp_sp": edp x sp (expert gradient reduction when sp > 1);
//   "embedding": the first and the last pipeline stage with the same dp, sp, tp (both hold the
//         tied token embedding); a middle stage's group is itself alone;
//   "pp_down": the members of "pp" again, for the pipeline's transfers to a lower pipeline rank
//         (parallel/pipeline/executor.h), so they never share a connection with those going up.
// With ep = 1 "edp" has the same members as "dp", and with pp <= 2 "embedding" as "pp";
// comm::Mesh builds one group per distinct set of ranks (and one of its own for "ep" and for
// "pp_down", comm/mesh.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/parallel_options.h"

namespace tessera {

struct MeshCoord {
  int64_t pp = 0, dp = 0, sp = 0, tp = 0;
};

class ParallelDims {
 public:
  // Throws tessera::Error naming `source` and the parallel.* keys when the degrees do not fit.
  ParallelDims(const ParallelOptions& options, int64_t world_size, const std::string& source);

  int64_t world_size() const { return world_; }
  int64_t dp() const { return dp_; }
  int64_t tp() const { return tp_; }
  int64_t pp() const { return pp_; }
  int64_t sp() const { return sp_; }
  int64_t ep() const { return ep_; }

  MeshCoord coord(int64_t rank) const;
  int64_t rank(const MeshCoord& c) const;

  static const std::vector<std::string>& group_names();
  // The group named `dim` that contains `rank`.
  std::vector<int64_t> group_of(const std::string& dim, int64_t rank) const;
  // Every group named `dim`, in order of their smallest rank.
  std::vector<std::vector<int64_t>> groups(const std::string& dim) const;

  std::string describe() const;  // "dp=2 tp=1 pp=1 sp=1 ep=1 (world 2)"

 private:
  int64_t world_, dp_, tp_, pp_, sp_, ep_;
};

}  // namespace tessera
