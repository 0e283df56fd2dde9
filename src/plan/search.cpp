// The planner's search (search.h).
#include "plan/search.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <numeric>
#include <optional>
#include <tuple>

#include "core/error.h"
#include "plan/memory_estimate.h"
#include "plan/swarm_cost.h"

namespace tessera::plan {
namespace {

template <class T>
std::vector<T> held_or(const std::set<std::string>& held, const std::string& key, const T& value, std::vector<T> all) {
  if (held.count(key)) return {value};
  return all;
}

std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> out;
  for (int64_t d = 1; d <= n; ++d)
    if (n % d == 0) out.push_back(d);
  return out;
}

std::vector<int64_t> powers_of_two_dividing(int64_t n, int64_t at_most) {
  std::vector<int64_t> out;
  for (int64_t d = 1; d <= std::min(n, at_most); d *= 2)
    if (n % d == 0) out.push_back(d);
  return out;
}

struct Schedule {
  std::string name;
  int64_t virtual_stages;
};

// The schedules of a pipeline of `pp` ranks over `layers` blocks: each built-in, interleaved with
// every stages-per-rank count from 2 that the blocks allow.
std::vector<Schedule> schedules(int64_t pp, int64_t layers) {
  if (pp == 1) return {{"1f1b", 0}};
  std::vector<Schedule> out = {{"1f1b", 0}, {"gpipe", 0}, {"zbh1", 0}};
  if (layers >= 2 * pp) out.push_back({"zbv", 0});
  for (int64_t v = 2; v * pp <= layers; ++v)
    if (layers % (v * pp) == 0) out.push_back({"interleaved", v});
  return out;
}

std::string text(int64_t v) { return std::to_string(v); }
std::string text(bool v) { return v ? "true" : "false"; }

}  // namespace

const std::vector<std::string>& searched_keys() {
  static const std::vector<std::string> keys = {"parallel.tp",         "parallel.pp",
                                                "parallel.sp",         "parallel.sp_method",
                                                "parallel.ep",         "parallel.ep_dispatch",
                                                "parallel.pp_schedule",
                                                "parallel.pp_virtual", "parallel.zero_stage",
                                                "parallel.megatron_sp", "parallel.offload",
                                                "memory.activation_checkpointing", "memory.swap",
                                                "train.batch_size"};
  return keys;
}

SearchResult search_layouts(const Config& base, int64_t world, const std::set<std::string>& held_keys,
                            const Cluster& cluster, const LayoutCheck& check, int64_t top, const CostOptions& options) {
  // memory.activation_policy = auto chooses each block's checkpointing: not searched.
  std::set<std::string> held = held_keys;
  if (base.memory.activation_policy == "auto") held.insert("memory.activation_checkpointing");
  const ParallelOptions& p = base.parallel;
  const ModelOptions& model = base.model;
  int64_t global = base.train.global_batch_size;
  if (global == 0) {
    const ParallelDims dims(p, world, "the config");
    global = base.train.batch_size * base.train.grad_accum * dims.dp();
  }
  const bool moe = model.ffn == "moe";

  SearchResult result;
  PlanCache cache;
  // One micro-batch's operations depend on the degrees and keys that change them, not on the
  // schedule or the ZeRO stage: priced once per combination. Under memory.activation_policy = auto
  // they do (each block's choice follows the rank's share of the budget and the micro-batches its
  // schedule holds), and each layout is priced on its own.
  const bool per_layout = base.memory.activation_policy == "auto";
  using OperationsKey =
      std::tuple<int64_t, int64_t, int64_t, std::string, int64_t, std::string, bool, std::string, int64_t, std::string>;
  std::map<OperationsKey, PricedOperations> operations;
  auto priced_for = [&](const Config& c, const ParallelDims& dims) -> const PricedOperations& {
    const std::string rest = per_layout ? c.parallel.pp_schedule + "/" + std::to_string(c.parallel.pp_virtual) + "/" +
                                              std::to_string(c.parallel.zero_stage) + "/" + text(c.parallel.offload)
                                        : std::string();
    const OperationsKey key{dims.tp(),         dims.pp(),
                            dims.sp(),         c.parallel.sp_method,
                            dims.ep(),         c.parallel.ep_dispatch,
                            c.parallel.megatron_sp, c.memory.activation_checkpointing,
                            c.train.batch_size, rest};
    auto it = operations.find(key);
    if (it == operations.end()) it = operations.emplace(key, price_operations(c, dims, cluster, options)).first;
    return it->second;
  };
  auto consider_swarm = [&](Config c, std::vector<std::pair<std::string, std::string>> set) {
    ++result.considered;
    try {
      Prediction bound = predict_swarm(c, world, cluster, options, /*with_memory=*/false);
      // Shown as what each peer runs (one device), its peers counted as data-parallel ranks.
      const int64_t target = c.swarm.target_batch_size, global_batch = c.train.global_batch_size;
      c = peer_config(c, world);
      c.swarm.target_batch_size = target, c.train.global_batch_size = global_batch;
      c.parallel.dp = world;
      const ParallelDims dims(c.parallel, world, "tessera plan");
      result.layouts.push_back({std::move(c), dims, std::move(bound), std::move(set), world});
    } catch (const std::exception& e) {
      if (result.refused++ == 0) result.first_refusal = e.what();
    }
  };
  // Layouts that differ only in their data-parallel side (ZeRO stage, offload, swap): bounded
  // together, their compute priced once.
  using Variant = std::pair<Config, std::vector<std::pair<std::string, std::string>>>;
  std::function<void(std::vector<Variant>)> consider = [&](std::vector<Variant> variants) {
    if (per_layout && variants.size() > 1) {
      for (Variant& v : variants) consider({std::move(v)});
      return;
    }
    result.considered += static_cast<int64_t>(variants.size());
    try {
      std::vector<Config> configs;
      for (Variant& v : variants) {
        v.first.parallel.dp = 0;
        v.first.train.global_batch_size = global;
        v.first.train.grad_accum = 1;
        configs.push_back(v.first);
      }
      const ParallelDims dims(configs.front().parallel, world, "tessera plan");
      if (global % (configs.front().train.batch_size * dims.dp()) != 0) fail("the global batch does not divide");
      const std::vector<double> bounds =
          step_lower_bounds(configs, dims, cluster, priced_for(configs.front(), dims), &cache);
      for (size_t i = 0; i < variants.size(); ++i) {
        Prediction bound;
        bound.step_s = bounds[i];
        result.layouts.push_back({std::move(variants[i].first), dims, std::move(bound), std::move(variants[i].second)});
      }
    } catch (const std::exception& e) {
      if (result.refused == 0) result.first_refusal = e.what();
      result.refused += static_cast<int64_t>(variants.size());
    }
  };

  // Sequence parallelism within a node beside tp (sp x tp at most a node's devices) unless held;
  // its methods by the attention (ulysses and ring for softmax, lasp and lasp2 for linear).
  const bool linear = model.arch == "linear";
  const int64_t node = cluster.cluster.devices_per_node;
  // The host's work (offload, swap) is planned where the cluster file prices it; a swap's device
  // budget, unless held, leaves a tenth of the device to the framework and the allocator.
  const bool host_priced = cluster.host.optimizer_gbs > 0 && cluster.host.device_link_gbs > 0;
  auto with_swap = [&](Config& c, std::vector<std::pair<std::string, std::string>>& set, bool swap) {
    c.memory.swap = swap;
    if (!swap) return;
    char budget[32];
    if (held.count("memory.device_budget_gb")) std::snprintf(budget, sizeof budget, "%g", c.memory.device_budget_gb);
    else std::snprintf(budget, sizeof budget, "%.3g", 0.9 * cluster.device.memory_gib);
    c.memory.device_budget_gb = std::stod(budget);
    set.push_back({"memory.swap", "true"});
    set.push_back({"memory.device_budget_gb", budget});
  };
  // Holding swarm.sync plans swarms only.
  const bool swarms_only = held.count("swarm.sync") > 0;
  for (int64_t tp : held_or<int64_t>(held, "parallel.tp", p.tp, powers_of_two_dividing(model.n_head, node))) {
    if (swarms_only) break;
    for (int64_t sp : held_or<int64_t>(held, "parallel.sp", p.sp, powers_of_two_dividing(base.train.seq_len, node / tp))) {
      const std::vector<std::string> methods =
          held.count("parallel.sp_method") || sp == 1 ? std::vector<std::string>{p.sp_method}
          : linear                                    ? std::vector<std::string>{"lasp", "lasp2"}
                                                      : std::vector<std::string>{"ulysses", "ring"};
      for (int64_t pp : held_or<int64_t>(held, "parallel.pp", p.pp, divisors(model.n_layer))) {
        if (world % (tp * pp * sp) != 0) continue;
        const int64_t dp = world / (tp * pp * sp);
        if (global % dp != 0) continue;
        // Experts split over ep data-parallel ranks: powers of two dividing the experts and dp.
        const std::vector<int64_t> eps = held_or<int64_t>(
            held, "parallel.ep", p.ep, moe ? powers_of_two_dividing(std::gcd(model.moe_experts, dp), dp) : std::vector<int64_t>{1});
        // Each ep with each dispatch (both where ep > 1).
        std::vector<std::pair<int64_t, std::string>> ep_dispatches;
        for (int64_t ep : eps)
          for (const std::string& dispatch :
               held_or<std::string>(held, "parallel.ep_dispatch", p.ep_dispatch,
                                    ep > 1 ? std::vector<std::string>{"alltoall", "hierarchical"}
                                           : std::vector<std::string>{"alltoall"}))
            if (ep > 1 || dispatch == "alltoall") ep_dispatches.emplace_back(ep, dispatch);
        std::vector<Schedule> scheds = schedules(pp, model.n_layer);
        if (held.count("parallel.pp_schedule")) {
          // The held schedule, with each stages-per-rank count the search would try for it.
          scheds.erase(std::remove_if(scheds.begin(), scheds.end(),
                                      [&](const Schedule& s) { return s.name != p.pp_schedule; }),
                       scheds.end());
          if (scheds.empty() || held.count("parallel.pp_virtual")) scheds = {{p.pp_schedule, p.pp_virtual}};
        } else if (held.count("parallel.pp_virtual")) {
          scheds.erase(std::remove_if(scheds.begin(), scheds.end(),
                                      [&](const Schedule& s) {
                                        return s.name == "interleaved" && s.virtual_stages != p.pp_virtual;
                                      }),
                       scheds.end());
          for (Schedule& s : scheds) s.virtual_stages = p.pp_virtual;
        }
        const std::vector<int64_t> micro = powers_of_two_dividing(global / dp, global / dp);
        for (const std::string& method : methods)
          for (const auto& [ep, dispatch] : ep_dispatches)
            for (const Schedule& schedule : scheds)
              for (bool msp : held_or<bool>(held, "parallel.megatron_sp", p.megatron_sp,
                                            tp > 1 && !moe ? std::vector<bool>{false, true} : std::vector<bool>{false}))
                for (const std::string& ckpt :
                     held_or<std::string>(held, "memory.activation_checkpointing", base.memory.activation_checkpointing,
                                          {"none", "selective", "full"}))
                  for (int64_t b : held_or<int64_t>(held, "train.batch_size", base.train.batch_size, micro)) {
                    std::vector<Variant> variants;
                    for (int64_t zero : held_or<int64_t>(held, "parallel.zero_stage", p.zero_stage,
                                                         dp > 1 ? std::vector<int64_t>{0, 1, 2, 3} : std::vector<int64_t>{0}))
                      for (bool offload : held_or<bool>(held, "parallel.offload", p.offload,
                                                        zero >= 1 && host_priced ? std::vector<bool>{false, true}
                                                                                 : std::vector<bool>{false}))
                        for (bool swap : held_or<bool>(held, "memory.swap", base.memory.swap,
                                                       tp * pp * sp * ep == 1 && zero == 0 && !offload && host_priced &&
                                                               (dp == 1 || cluster.device.kind == "cpu")
                                                           ? std::vector<bool>{false, true}
                                                           : std::vector<bool>{false})) {
                          Config c = base;
                          c.parallel.tp = tp, c.parallel.pp = pp, c.parallel.sp = sp, c.parallel.sp_method = method;
                          c.parallel.ep = ep, c.parallel.zero_stage = zero, c.parallel.megatron_sp = msp;
                          c.parallel.ep_dispatch = dispatch;
                          c.parallel.offload = offload;
                          c.parallel.pp_schedule = schedule.name;
                          c.parallel.pp_virtual = schedule.virtual_stages;
                          c.memory.activation_checkpointing = ckpt;
                          c.train.batch_size = b;
                          std::vector<std::pair<std::string, std::string>> set = {
                              {"parallel.tp", text(tp)},
                              {"parallel.pp", text(pp)},
                              {"parallel.sp", text(sp)},
                              {"parallel.zero_stage", text(zero)},
                              {"parallel.megatron_sp", text(msp)},
                              {"memory.activation_checkpointing", ckpt},
                              {"train.batch_size", text(b)},
                              {"train.global_batch_size", text(global)}};
                          if (offload) set.push_back({"parallel.offload", "true"});
                          with_swap(c, set, swap);
                          if (sp > 1) set.push_back({"parallel.sp_method", method});
                          if (moe) set.push_back({"parallel.ep", text(ep)});
                          if (ep > 1) set.push_back({"parallel.ep_dispatch", dispatch});
                          if (pp > 1) {
                            set.push_back({"parallel.pp_schedule", schedule.name});
                            if (c.parallel.pp_virtual > 0)
                              set.push_back({"parallel.pp_virtual", text(c.parallel.pp_virtual)});
                          }
                          variants.emplace_back(std::move(c), std::move(set));
                        }
                    consider(std::move(variants));
                  }
      }
    }
  }
  // ATOM swarms (`tessera peer`): every rank a peer of one device, resident or swapped, where the
  // cluster file gives the peers' link and no held key asks for more than one device per run.
  // Batch mode is data parallelism's arithmetic; DiLoCo trains differently, so it is planned only
  // when held (swarm.sync = diloco), its local step the peer's share of the global batch.
  const bool one_device = (!held.count("parallel.tp") || p.tp == 1) && (!held.count("parallel.pp") || p.pp == 1) &&
                          (!held.count("parallel.sp") || p.sp == 1) && (!held.count("parallel.ep") || p.ep == 1) &&
                          (!held.count("parallel.zero_stage") || p.zero_stage == 0) &&
                          (!held.count("parallel.offload") || !p.offload);
  if (cluster.peers.bandwidth_gbs > 0 && world > 1 && one_device && global % world == 0) {
    const std::vector<int64_t> micro = powers_of_two_dividing(global / world, global / world);
    const std::string sync = swarms_only ? base.swarm.sync : "batch";
    for (bool swap : held_or<bool>(held, "memory.swap", base.memory.swap,
                                   host_priced ? std::vector<bool>{false, true} : std::vector<bool>{false}))
      for (const std::string& ckpt : held_or<std::string>(held, "memory.activation_checkpointing",
                                                          base.memory.activation_checkpointing, {"none", "selective", "full"}))
        for (int64_t b : held_or<int64_t>(held, "train.batch_size", base.train.batch_size, micro)) {
          Config c = base;
          c.swarm.sync = sync;
          c.memory.activation_checkpointing = ckpt;
          c.train.batch_size = b;
          std::vector<std::pair<std::string, std::string>> set = {{"swarm.sync", sync}};
          if (sync == "batch") {
            c.swarm.target_batch_size = global;
            c.train.global_batch_size = 0;
            c.train.grad_accum = global / (world * b);
            set.push_back({"swarm.target_batch_size", text(global)});
            set.push_back({"train.global_batch_size", "0"});
          } else {
            c.train.global_batch_size = global / world;
            c.train.grad_accum = 1;
            set.push_back({"swarm.inner_steps", text(c.swarm.inner_steps)});
            set.push_back({"swarm.pseudo_gradient_dtype", c.swarm.pseudo_gradient_dtype});
            set.push_back({"train.global_batch_size", text(c.train.global_batch_size)});
          }
          with_swap(c, set, swap);
          set.push_back({"memory.activation_checkpointing", ckpt});
          set.push_back({"train.batch_size", text(b)});
          set.push_back({"train.grad_accum", text(c.train.accumulation(1))});
          consider_swarm(std::move(c), std::move(set));
        }
  }
  // Branch and bound: in the order of their lower bounds (each candidate's prediction holds its
  // bound so far), check each layout and estimate its memory, then predict its step where it can
  // still be shown: keep the `top` fastest that fit and the `top` fastest that do not, and stop
  // where the next bound is no faster than the last that fits. The layout checks and the memory
  // estimate run only for the layouts reached.
  // Steps within 0.01% of each other (the same bucket of a log scale) count as equal, and then
  // the layout with fewer moving parts goes first: without a swarm (a swarm's round priced as the
  // all-reduce it replaces, with no round overhead measured, ties with it).
  auto bucket = [](const Candidate& c) { return std::llround(std::log(c.prediction.step_s) / std::log1p(1e-4)); };
  auto faster = [&](const Candidate& a, const Candidate& b) {
    if (bucket(a) != bucket(b)) return bucket(a) < bucket(b);
    return (a.peers > 0) < (b.peers > 0);
  };
  std::vector<size_t> order(result.layouts.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return faster(result.layouts[a], result.layouts[b]); });
  std::vector<Candidate> fitting, too_large;
  auto full = [&](const std::vector<Candidate>& list) { return static_cast<int64_t>(list.size()) >= top; };
  for (const size_t index : order) {
    Candidate& c = result.layouts[index];
    const double bound = c.prediction.step_s;
    if (full(fitting) && bound >= fitting.back().prediction.step_s) break;
    Prediction memory;
    try {
      c.config.check("tessera plan");
      if (c.peers > 0) {
        c.prediction = memory = predict_swarm(c.config, c.peers, cluster, options);
      } else {
        check(c.config, c.dims);
        // What cannot fit and cannot be among the non-fitting layouts shown is left there, before
        // its table is built.
        if (full(too_large) && bound >= too_large.back().prediction.step_s && !c.config.memory.swap &&
            model_state_lower_bound(c.config, c.dims) > cluster.device.memory_bytes())
          continue;
        add_memory(memory, c.config, cache.layout(c.config, c.dims), cluster);
        if (!memory.fits && full(too_large) && bound >= too_large.back().prediction.step_s) continue;
        c.prediction = predict_time(c.config, c.dims, cluster, options, &priced_for(c.config, c.dims), &cache);
      }
    } catch (const std::exception& e) {
      if (result.refused++ == 0) result.first_refusal = e.what();
      continue;
    }
    c.prediction.peak_memory_bytes = memory.peak_memory_bytes;
    c.prediction.fits = memory.fits;
    c.prediction.activation_policies = std::move(memory.activation_policies);
    c.prediction.memory_estimated = true;
    ++result.predicted;
    std::vector<Candidate>& into = c.prediction.fits ? fitting : too_large;
    into.insert(std::upper_bound(into.begin(), into.end(), c, faster), std::move(c));
    if (static_cast<int64_t>(into.size()) > top) into.pop_back();
  }
  // Then those faster than the slowest shown that do not fit (all of them, up to `top`, when
  // nothing fits): what memory costs.
  const double shown = fitting.empty() ? 1e300 : fitting.back().prediction.step_s;
  result.layouts = std::move(fitting);
  int64_t added = 0;
  for (Candidate& c : too_large)
    if (c.prediction.step_s < shown && added++ < top) result.layouts.push_back(std::move(c));
  return result;
}

}  // namespace tessera::plan
