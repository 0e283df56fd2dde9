// The Layout value and what it is made from (layout.h).
#include "plan/layout.h"

#include <set>

#include "comm/rendezvous.h"
#include "core/error.h"
#include "parallel/pipeline/schedule_builders.h"
#include "plan/profile_cut.h"
#include "plan/swap_policy.h"

namespace tessera {

Layout::Layout(ParallelDims dims, std::optional<StageCut> cut, std::optional<pipeline::Schedule> schedule,
               std::optional<swap::SwapPlan> swap, std::vector<ActivationPolicy> activations)
    : dims_(std::move(dims)),
      cut_(std::move(cut)),
      schedule_(std::move(schedule)),
      swap_(std::move(swap)),
      activations_(std::move(activations)) {}

const StageCut& Layout::cut() const {
  require(cut_.has_value(), "internal: the pipeline cut of a layout without pipeline parallelism");
  return *cut_;
}

const pipeline::Schedule& Layout::schedule() const {
  require(schedule_.has_value(), "internal: the pipeline schedule of a layout without pipeline parallelism");
  return *schedule_;
}

ModelStage Layout::stage_of(int64_t pp_rank) const {
  if (!cut_) return ModelStage{};
  return rank_stage(*cut_, *schedule_, pp_rank);
}

int64_t Layout::block_holder(int64_t block) const {
  if (!cut_) return 0;
  for (int64_t s = 0; s < cut_->stages(); ++s)
    if (block < cut_->boundaries[s + 1]) return schedule_->rank_of(s);
  fail("internal: block ", block, " beyond the pipeline cut's ", cut_->boundaries.back(), " blocks");
}

int64_t Layout::embedding_holder() const { return cut_ ? schedule_->rank_of(0) : 0; }
int64_t Layout::head_holder() const { return cut_ ? schedule_->rank_of(cut_->stages() - 1) : 0; }

const ActivationPolicy* Layout::activation_policy(int64_t pp_rank) const {
  if (activations_.empty()) return nullptr;
  require(pp_rank >= 0 && pp_rank < static_cast<int64_t>(activations_.size()), "internal: no activation policy for "
          "pipeline rank ", pp_rank, " of ", activations_.size());
  return &activations_[static_cast<size_t>(pp_rank)];
}

const swap::SwapPlan& Layout::swap_plan() const {
  require(swap_.has_value(), "internal: the swap plan of a layout that does not swap (or was not measured)");
  return *swap_;
}

pipeline::Gathers layout_gathers(const ParallelOptions& parallel, const ParallelDims& dims) {
  if (dims.pp() == 1 || parallel.zero_stage != 3 || (dims.dp() * dims.sp() == 1 && !parallel.offload))
    return pipeline::Gathers::none;
  return parallel.zero3_reshard_per_microbatch ? pipeline::Gathers::per_action : pipeline::Gathers::per_step;
}

Layout make_layout(const Config& config, const ParallelDims& dims, const LayoutMeasurements& measured) {
  std::optional<StageCut> cut;
  std::optional<pipeline::Schedule> schedule;
  if (dims.pp() > 1) {
    const ParallelOptions& p = config.parallel;
    cut = p.pp_layers.empty() && p.pp_cut == "profile" && measured.blocks
              ? cut_by_time(config.model, dims.pp() * p.pipeline_virtual(), *measured.blocks)
              : pipeline_cut(config, dims);
    if (measured.blocks) add_measured_costs(*cut, *measured.blocks);
    schedule = pipeline::schedule_for_options(p, dims.pp(), config.train.accumulation(dims.dp()),
                                              layout_gathers(p, dims));
    require(cut->stages() == schedule->stages(), "internal: a cut of ", cut->stages(), " stages for a schedule of ",
            schedule->stages());
  }
  std::optional<swap::SwapPlan> swap;
  if (config.memory.swap && measured.swap && config.memory.activation_policy == "auto" && measured.blocks) {
    // The policy and the swap plan share the budget: chosen together (plan/swap_policy.h).
    SwappedActivationPolicy chosen =
        choose_swapped_activation_policy(config, dims, *measured.blocks, *measured.swap, measured.cpu_device);
    return Layout(dims, std::move(cut), std::move(schedule), std::move(chosen.plan), {std::move(chosen.policy)});
  }
  if (config.memory.swap && measured.swap) swap = plan_swap(config, *measured.swap, dims.dp());
  if (config.memory.activation_policy != "auto" || !measured.blocks)
    return Layout(dims, std::move(cut), std::move(schedule), std::move(swap));
  std::vector<ActivationPolicy> activations =
      choose_activation_policies(config, Layout(dims, cut, schedule, swap), *measured.blocks, measured.cpu_device);
  return Layout(dims, std::move(cut), std::move(schedule), std::move(swap), std::move(activations));
}

namespace {

// "expert dispatch: ..." for ep > 1: the dispatch and the nodes the ep group spans (global rank /
// parallel.ranks_per_node, or the launcher's processes per node).
std::string describe_expert_dispatch(const Config& config, const ParallelDims& dims) {
  if (dims.ep() == 1) return "";
  const int64_t per_node = comm::processes_per_node(config.parallel.ranks_per_node);
  std::set<int64_t> nodes;
  for (int64_t rank : dims.group_of("ep", 0)) nodes.insert(rank / per_node);
  const std::string span = std::to_string(dims.ep()) + " ranks on " + std::to_string(nodes.size()) +
                           (nodes.size() == 1 ? " node" : " nodes");
  if (config.parallel.ep_dispatch == "hierarchical")
    return "expert dispatch: hierarchical over " + span + " (a token once to each node it needs, then once to each "
           "rank there)\n";
  return "expert dispatch: all-to-all over " + span +
         (nodes.size() > 1 ? " (one row per choice; parallel.ep_dispatch = hierarchical sends a token once per node)\n"
                           : "\n");
}

}  // namespace

std::string describe_layout(const Config& config, const Layout& layout) {
  std::string out;
  out += describe_expert_dispatch(config, layout.dims());
  if (layout.pipelined()) out += describe_pipeline_layout(config, layout.dims(), layout.cut(), layout.schedule());
  if (layout.swapped()) out += describe_swap_plan(layout.swap_plan());
  for (const ActivationPolicy& policy : layout.activation_policies()) out += describe_activation_policy(policy);
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

LayoutMeasurements measure_layout(const Config& config, comm::Mesh* mesh, c10::Device device) {
  LayoutMeasurements m;
  // Under tp, sp or ep the profile's whole block may not fit where the run's split ones do, and no
  // step is predicted there (stage_cut.h): only the profile cut, which needs the balance, has it.
  const ParallelDims* dims = mesh ? &mesh->dims() : nullptr;
  const bool profile_cut = config.parallel.pp_cut == "profile" && config.parallel.pp_layers.empty();
  const bool auto_policy = config.memory.activation_policy == "auto";
  if (dims && ((dims->pp() > 1 && (profile_cut || (dims->tp() == 1 && dims->sp() == 1 && dims->ep() == 1))) ||
               auto_policy))
    m.blocks = profile_world_blocks(config, *mesh);
  else if (auto_policy)
    m.blocks = profile_blocks(config, device);
  m.cpu_device = device.is_cpu();
  if (config.memory.swap) m.swap = measure_swap_costs(config, device);
  return m;
}

}  // namespace tessera
