#include "core/parallel_dims.h"

#include <algorithm>
#include <sstream>

#include "core/error.h"

namespace tessera {

void ParallelOptions::check(const std::string& source) const {
  check_ranges(*this, "parallel", source);
  require(backend == "auto" || backend == "gloo" || backend == "nccl", source,
          ": parallel.backend must be auto, gloo or nccl (got \"", backend, "\")");
  const char* sp_methods[] = {"auto", "lasp", "lasp2", "ulysses", "ring"};
  require(std::find(std::begin(sp_methods), std::end(sp_methods), sp_method) != std::end(sp_methods), source,
          ": parallel.sp_method must be auto, lasp, lasp2, ulysses or ring (got \"", sp_method, "\")");
  require(pp_transfer_dtype == "compute" || pp_transfer_dtype == "float32", source,
          ": parallel.pp_transfer_dtype must be compute or float32 (got \"", pp_transfer_dtype, "\")");
  require(pp_schedule_costs == "measured" || pp_schedule_costs == "unit", source,
          ": parallel.pp_schedule_costs must be measured or unit (got \"", pp_schedule_costs, "\")");
  require(ep_dispatch == "alltoall" || ep_dispatch == "hierarchical", source,
          ": parallel.ep_dispatch must be alltoall or hierarchical (got \"", ep_dispatch, "\")");
  require(pp_cut == "layers" || pp_cut == "params" || pp_cut == "profile", source,
          ": parallel.pp_cut must be layers, params or profile (got \"", pp_cut, "\")");
  require(!zero3_reshard_per_microbatch || (zero_stage == 3 && pp > 1), source,
          ": parallel.zero3_reshard_per_microbatch = true needs parallel.zero_stage = 3 and parallel.pp > 1 (got "
          "zero_stage ", zero_stage, ", pp ", pp, "); without a pipeline ZeRO-3 already gathers each block around "
          "its forward and its backward");
}

int64_t ParallelOptions::pipeline_virtual() const {
  if (pp_virtual > 0) return pp_virtual;
  return pp_schedule == "interleaved" || pp_schedule == "zbv" || pp_schedule == "dualpipev" ? 2 : 1;
}

bool ParallelOptions::table_for_measured_costs() const {
  return (pp_schedule == "zbv" || pp_schedule == "zbh1") && pp_schedule_costs == "measured";
}

ParallelDims::ParallelDims(const ParallelOptions& o, int64_t world_size, const std::string& source)
    : world_(world_size), dp_(o.dp), tp_(o.tp), pp_(o.pp), sp_(o.sp), ep_(o.ep) {
  o.check(source);
  require(world_size >= 1, source, ": world size must be at least 1 (got ", world_size, ")");
  const int64_t model_ranks = tp_ * pp_ * sp_;
  if (dp_ == 0) {
    require(world_size % model_ranks == 0, source, ": parallel.tp * parallel.pp * parallel.sp = ", tp_, " * ", pp_,
            " * ", sp_, " = ", model_ranks, " does not divide the world size ", world_size);
    dp_ = world_size / model_ranks;
  }
  require(dp_ * model_ranks == world_size, source, ": parallel.dp * tp * pp * sp = ", dp_, " * ", tp_, " * ", pp_,
          " * ", sp_, " = ", dp_ * model_ranks, " but the world has ", world_size, " ranks");
  require(dp_ % ep_ == 0, source, ": parallel.ep = ", ep_, " must divide the data-parallel degree ", dp_);
}

MeshCoord ParallelDims::coord(int64_t rank) const {
  MeshCoord c;
  c.tp = rank % tp_;
  rank /= tp_;
  c.sp = rank % sp_;
  rank /= sp_;
  c.dp = rank % dp_;
  c.pp = rank / dp_;
  return c;
}

int64_t ParallelDims::rank(const MeshCoord& c) const { return ((c.pp * dp_ + c.dp) * sp_ + c.sp) * tp_ + c.tp; }

const std::vector<std::string>& ParallelDims::group_names() {
  static const std::vector<std::string> names = {"dp", "tp", "pp", "sp", "ep", "dp_sp", "edp", "edp_sp", "embedding", "pp_down"};
  return names;
}

std::vector<int64_t> ParallelDims::group_of(const std::string& dim, int64_t rank) const {
  const MeshCoord me = coord(rank);
  // The coordinates each dimension lets vary (the others stay at `me`'s); walked in the mesh's
  // order (pp, dp, sp, tp), so the ranks come out ascending.
  auto only = [](int64_t v) { return std::vector<int64_t>{v}; };
  auto all = [](int64_t n) {
    std::vector<int64_t> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = i;
    return v;
  };
  auto dp_where = [&](auto keep) {
    std::vector<int64_t> v;
    for (int64_t i = 0; i < dp_; ++i)
      if (keep(i)) v.push_back(i);
    return v;
  };
  std::vector<int64_t> pps = only(me.pp), dps = only(me.dp), sps = only(me.sp), tps = only(me.tp);
  if (dim == "tp") tps = all(tp_);
  else if (dim == "sp") sps = all(sp_);
  else if (dim == "dp") dps = all(dp_);
  else if (dim == "pp" || dim == "pp_down") pps = all(pp_);
  else if (dim == "dp_sp") dps = all(dp_), sps = all(sp_);
  else if (dim == "ep") dps = dp_where([&](int64_t i) { return i / ep_ == me.dp / ep_; });
  else if (dim == "edp") dps = dp_where([&](int64_t i) { return i % ep_ == me.dp % ep_; });
  else if (dim == "edp_sp") dps = dp_where([&](int64_t i) { return i % ep_ == me.dp % ep_; }), sps = all(sp_);
  else if (dim == "embedding") {
    const bool end = me.pp == 0 || me.pp == pp_ - 1;
    if (end && pp_ > 1) pps = {0, pp_ - 1};
  } else {
    fail("internal: unknown mesh dimension \"", dim, "\"");
  }
  std::vector<int64_t> out;
  for (const int64_t p : pps)
    for (const int64_t d : dps)
      for (const int64_t s : sps)
        for (const int64_t t : tps) out.push_back(this->rank({p, d, s, t}));
  return out;
}

std::vector<std::vector<int64_t>> ParallelDims::groups(const std::string& dim) const {
  std::vector<std::vector<int64_t>> out;
  for (int64_t r = 0; r < world_; ++r) {
    auto g = group_of(dim, r);
    if (g.front() == r) out.push_back(std::move(g));
  }
  return out;
}

std::string ParallelDims::describe() const {
  std::ostringstream s;
  s << "dp=" << dp_ << " tp=" << tp_ << " pp=" << pp_ << " sp=" << sp_ << " ep=" << ep_ << " (world " << world_ << ")";
  return s.str();
}

}  // namespace tessera
