// Pipeline stage cuts (stage_cut.h).
#include "plan/stage_cut.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <limits>
#include <utility>

#include "core/byte_size.h"
#include "core/error.h"
#include "model/transformer.h"
#include "model/parameter_census.h"
#include "plan/memory_estimate.h"
#include "parallel/pipeline/schedule_builders.h"
#include "parallel/pipeline/simulate.h"
#include "parallel/pipeline/validate.h"

namespace tessera {
namespace {

// Parameters of each block, of the embeddings (wte, wpe), of ln_f and of wte alone (the last
// stage's copy of the tied embedding when it is not also the first), from the meta model.
struct BlockWeights {
  std::vector<int64_t> block;
  int64_t embedding = 0, final_norm = 0, wte = 0;
};

// The parameters stage s of `stages` holds with blocks [first, end).
int64_t stage_weight(const BlockWeights& w, int64_t s, int64_t stages, int64_t first, int64_t end) {
  int64_t total = 0;
  for (int64_t i = first; i < end; ++i) total += w.block[i];
  if (s == 0) total += w.embedding;
  if (s == stages - 1) total += w.final_norm + (stages > 1 ? w.wte : 0);
  return total;
}

BlockWeights block_weights(const ModelOptions& m) {
  BlockWeights w;
  w.block.assign(m.n_layer, 0);
  for (const CensusEntry& item : *parameter_census(m)) {
    const ParameterSpec& spec = item.spec;
    const int64_t n = item.meta.numel();
    if (spec.block >= 0) w.block[spec.block] += n;
    else if (spec.end == ModelEnd::head) w.final_norm += n;
    else w.embedding += n;
    if (spec.tied) w.wte = n;
  }
  return w;
}


}  // namespace

bool StageCut::even() const {
  for (int64_t s = 1; s < stages(); ++s)
    if (boundaries[s + 1] - boundaries[s] != boundaries[1] - boundaries[0]) return false;
  return true;
}

namespace {

// The contiguous cut of `blocks` blocks into `stages` minimizing the largest cost(stage, first,
// end), exact by dynamic programming over the block boundaries; its S + 1 boundaries.
std::vector<int64_t> balanced_cut(int64_t blocks, int64_t stages,
                                  const std::function<double(int64_t stage, int64_t first, int64_t end)>& cost) {
  // best[s][b]: for stages 0..s-1 holding blocks [0, b), the smallest largest stage cost and,
  // among the cuts reaching it, the smallest sum of squared stage costs (the most even).
  using Cost = std::pair<double, double>;
  const Cost none{std::numeric_limits<double>::infinity(), 0};
  const int64_t L = blocks;
  std::vector<std::vector<Cost>> best(stages + 1, std::vector<Cost>(L + 1, none));
  std::vector<std::vector<int64_t>> from(stages + 1, std::vector<int64_t>(L + 1, -1));
  best[0][0] = {0, 0};
  for (int64_t s = 1; s <= stages; ++s)
    for (int64_t b = s; b <= L - (stages - s); ++b)
      for (int64_t a = s - 1; a < b; ++a) {
        if (best[s - 1][a] == none) continue;
        const double c = cost(s - 1, a, b);
        const Cost value{std::max(best[s - 1][a].first, c), best[s - 1][a].second + c * c};
        if (value < best[s][b]) {
          best[s][b] = value;
          from[s][b] = a;
        }
      }
  std::vector<int64_t> boundaries(stages + 1, L);
  for (int64_t s = stages; s > 0; --s) boundaries[s - 1] = from[s][boundaries[s]];
  boundaries[0] = 0;
  return boundaries;
}

}  // namespace

StageCut cut_stages(const ModelOptions& m, int64_t stages, const std::string& method) {
  require(stages >= 1 && stages <= m.n_layer, "parallel.pp x stages per rank = ", stages, " pipeline stages, but model.n_layer = ",
          m.n_layer, " blocks: every stage needs at least one block (lower parallel.pp or parallel.pp_virtual)");
  require(method == "layers" || method == "params", "internal: cut_stages by \"", method, "\"");
  const BlockWeights w = block_weights(m);
  const int64_t L = m.n_layer;
  StageCut cut;
  cut.method = method;
  if (method == "layers") {
    cut.boundaries.push_back(0);
    for (int64_t s = 0; s < stages; ++s) cut.boundaries.push_back(cut.boundaries.back() + L / stages + (s < L % stages ? 1 : 0));
  } else {
    cut.boundaries = balanced_cut(L, stages, [&](int64_t s, int64_t first, int64_t end) {
      return static_cast<double>(stage_weight(w, s, stages, first, end));
    });
  }
  for (int64_t s = 0; s < stages; ++s)
    cut.parameters.push_back(stage_weight(w, s, stages, cut.boundaries[s], cut.boundaries[s + 1]));
  return cut;
}

StageCut cut_by_time(const ModelOptions& m, int64_t stages, const BlockCosts& costs) {
  require(stages >= 1 && stages <= m.n_layer, "parallel.pp x stages per rank = ", stages, " pipeline stages, but model.n_layer = ",
          m.n_layer, " blocks: every stage needs at least one block (lower parallel.pp or parallel.pp_virtual)");
  require(static_cast<int64_t>(costs.block_seconds.size()) == m.n_layer, "internal: ", costs.block_seconds.size(),
          " block times for ", m.n_layer, " blocks");
  auto stage_seconds = [&](int64_t s, int64_t first, int64_t end) {
    double t = (s == 0 ? costs.embedding_seconds : 0) + (s == stages - 1 ? costs.head_seconds : 0);
    for (int64_t i = first; i < end; ++i) t += costs.block_seconds[i];
    return t;
  };
  StageCut cut = cut_stages(m, [&] {
    std::vector<int64_t> layers;
    const std::vector<int64_t> b = balanced_cut(m.n_layer, stages, stage_seconds);
    for (int64_t s = 0; s < stages; ++s) layers.push_back(b[s + 1] - b[s]);
    return layers;
  }());
  cut.method = "profile";
  add_measured_costs(cut, costs);
  return cut;
}

void add_measured_costs(StageCut& cut, const BlockCosts& costs) {
  const int64_t stages = cut.stages();
  require(static_cast<int64_t>(costs.block_seconds.size()) == cut.boundaries.back(), "internal: ",
          costs.block_seconds.size(), " block times for ", cut.boundaries.back(), " blocks");
  const bool split = !costs.block_split.empty();
  cut.seconds.clear();
  cut.activation_bytes.clear();
  cut.compute.clear();
  for (int64_t s = 0; s < stages; ++s) {
    const int64_t first = cut.boundaries[s], end = cut.boundaries[s + 1];
    double seconds = (s == 0 ? costs.embedding_seconds : 0) + (s == stages - 1 ? costs.head_seconds : 0), bytes = 0;
    pipeline::ActionCosts::Compute c;
    auto add = [&](const pipeline::ActionCosts::Compute& x) {
      c.f += x.f, c.b += x.b, c.i += x.i, c.w += x.w;
    };
    if (split && s == 0) add(costs.embedding_split);
    if (split && s == stages - 1) add(costs.head_split);
    for (int64_t i = first; i < end; ++i) {
      seconds += costs.block_seconds[i];
      bytes += costs.block_activation_bytes[i];
      if (split) add(costs.block_split[i]);
    }
    cut.seconds.push_back(seconds);
    cut.activation_bytes.push_back(bytes);
    if (split) cut.compute.push_back(c);
  }
}

StageCut cut_stages(const ModelOptions& m, const std::vector<int64_t>& layers) {
  const int64_t stages = static_cast<int64_t>(layers.size());
  StageCut cut;
  cut.method = "hand";
  cut.boundaries.push_back(0);
  std::string listed;
  for (int64_t n : layers) listed += (listed.empty() ? "" : ", ") + std::to_string(n);
  for (int64_t s = 0; s < stages; ++s) {
    require(layers[s] >= 1, "parallel.pp_layers = [", listed, "]: stage ", s, " has ", layers[s],
            " blocks; every stage needs at least one");
    cut.boundaries.push_back(cut.boundaries.back() + layers[s]);
  }
  require(cut.boundaries.back() == m.n_layer, "parallel.pp_layers = [", listed, "] holds ", cut.boundaries.back(),
          " blocks, but model.n_layer = ", m.n_layer, ": the stages must hold every block exactly once");
  const BlockWeights w = block_weights(m);
  for (int64_t s = 0; s < stages; ++s)
    cut.parameters.push_back(stage_weight(w, s, stages, cut.boundaries[s], cut.boundaries[s + 1]));
  return cut;
}

StageCut pipeline_cut(const Config& config, const ParallelDims& dims) {
  const ParallelOptions& p = config.parallel;
  const int64_t stages = dims.pp() * p.pipeline_virtual();
  if (p.pp_layers.empty() && p.pp_cut == "profile") {
    // Without the workers' measurements (a dry run, the launcher's memory check): make_layout
    // (plan/layout.h) cuts by measured time when it has them.
    StageCut cut = cut_stages(config.model, stages, "params");
    cut.method = "params until profiled";
    return cut;
  }
  if (p.pp_layers.empty()) return cut_stages(config.model, stages, p.pp_cut);
  require(static_cast<int64_t>(p.pp_layers.size()) == stages, "parallel.pp_layers has ", p.pp_layers.size(),
          " entries for ", stages, " pipeline stages (parallel.pp = ", dims.pp(), " x ", p.pipeline_virtual(),
          " stages per rank): give one block count per stage");
  return cut_stages(config.model, p.pp_layers);
}

std::string describe_stage_cut(const StageCut& cut) {
  std::string out;
  char text[160];
  for (int64_t s = 0; s < cut.stages(); ++s) {
    const int64_t first = cut.boundaries[s], end = cut.boundaries[s + 1];
    const std::string blocks = end - first == 1 ? "block " + std::to_string(first)
                                                : "blocks " + std::to_string(first) + "-" + std::to_string(end - 1);
    std::snprintf(text, sizeof text, "  stage %lld: %s%s%s (%s parameters", static_cast<long long>(s),
                  blocks.c_str(), s == 0 ? " + embedding" : "", s == cut.stages() - 1 ? " + head" : "",
                  format_count(cut.parameters[s]).c_str());
    out += text;
    if (!cut.compute.empty()) {
      const pipeline::ActionCosts::Compute& c = cut.compute[s];
      std::snprintf(text, sizeof text,
                    "; measured F %.2f ms, B %.2f ms, I %.2f ms, W %.2f ms, activations %s per micro-batch",
                    1000 * c.f, 1000 * c.b, 1000 * c.i, 1000 * c.w, format_bytes(cut.activation_bytes[s]).c_str());
      out += text;
    } else if (!cut.seconds.empty()) {
      std::snprintf(text, sizeof text, "; measured forward + backward %.2f ms, activations %s per micro-batch",
                    1000 * cut.seconds[s], format_bytes(cut.activation_bytes[s]).c_str());
      out += text;
    }
    out += ")\n";
  }
  if (!cut.even())
    out += "  (the blocks do not divide evenly into " + std::to_string(cut.stages()) + " stages: the cut above is " +
           (cut.method == "layers"    ? std::string("as even as it can be, no block dropped")
            : cut.method == "hand"    ? std::string("parallel.pp_layers, by hand")
            : cut.method == "profile" ? std::string("balanced by measured time, no block dropped")
                                      : std::string("balanced by parameters, no block dropped")) + ")\n";
  if (cut.method == "params until profiled")
    out += "  (parallel.pp_cut = profile: the workers measure every block at start and cut by time; this is the "
           "parameter cut meanwhile)\n";
  if (cut.method == "profile") {
    const double slowest = *std::max_element(cut.seconds.begin(), cut.seconds.end());
    double total = 0;
    for (double t : cut.seconds) total += t;
    char line[200];
    std::snprintf(line, sizeof line, "  slowest stage %.2f ms against an even share of %.2f ms (%.0f%% balanced)\n",
                  1000 * slowest, 1000 * total / static_cast<double>(cut.stages()), 100 * total / (slowest * static_cast<double>(cut.stages())));
    out += line;
  }
  return out;
}

std::string describe_pipeline_layout(const Config& config, const ParallelDims& dims, const StageCut& cut,
                                     const pipeline::Schedule& schedule) {
  const pipeline::Simulation sim = pipeline::simulate_schedule(schedule);
  char text[200];
  std::snprintf(text, sizeof text, "pipeline: %s, %lld ranks x %lld stage(s), cut by %s:\n", schedule.name.c_str(),
                static_cast<long long>(dims.pp()), static_cast<long long>(config.parallel.pipeline_virtual()),
                cut.method.c_str());
  std::string out = text + describe_stage_cut(cut);
  std::snprintf(text, sizeof text, "  %lld micro-batches per step: simulated bubble %.1f%% (equal F, I, W costs)\n",
                static_cast<long long>(schedule.micro_batches), 100 * sim.bubble());
  out += text;
  if (const std::optional<pipeline::Simulation> predicted = predicted_step(dims, cut, schedule)) {
    std::snprintf(text, sizeof text,
                  "  with each stage's measured F, I, W: predicted step %.1f ms, bubble %.1f%% (transfers not "
                  "counted; a run checks it after step %lld)\n",
                  1000 * predicted->step_time, 100 * predicted->bubble(), static_cast<long long>(kPredictionCheckedAtStep));
    out += text;
  } else if (!cut.compute.empty()) {
    out += "  (the profile times whole blocks: no step is predicted under tensor, sequence or expert parallelism)\n";
  }
  if (config.parallel.table_for_measured_costs())
    out += "  " + config.parallel.pp_schedule +
           "'s table is built again after step 2 for the F, I and W measured then, with backwards run whole "
           "where the profile's B is cheaper than I + W (parallel.pp_schedule_costs = measured)\n";
  return out;
}

std::optional<pipeline::ActionCosts> predicted_costs(const ParallelDims& dims, const StageCut& cut) {
  if (cut.compute.empty() || dims.tp() > 1 || dims.sp() > 1 || dims.ep() > 1) return std::nullopt;
  pipeline::ActionCosts costs;
  costs.stages = cut.compute;
  return costs;
}

std::optional<pipeline::Simulation> predicted_step(const ParallelDims& dims, const StageCut& cut,
                                                   const pipeline::Schedule& schedule) {
  const std::optional<pipeline::ActionCosts> costs = predicted_costs(dims, cut);
  if (!costs) return std::nullopt;
  return pipeline::simulate_schedule(schedule, *costs);
}

ModelStage rank_stage(const StageCut& cut, const pipeline::Schedule& schedule, int64_t rank) {
  require(cut.stages() == schedule.stages(), "internal: a cut of ", cut.stages(), " stages for a schedule of ",
          schedule.stages());
  ModelStage mine;
  for (int64_t s = 0; s < cut.stages(); ++s)
    if (schedule.rank_of(s) == rank) mine.chunks.emplace_back(cut.boundaries[s], cut.boundaries[s + 1]);
  std::sort(mine.chunks.begin(), mine.chunks.end());
  return mine;
}

}  // namespace tessera
