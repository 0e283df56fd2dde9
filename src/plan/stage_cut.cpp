// Pipeline stage cuts (stage_cut.h).
#include "plan/stage_cut.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <utility>

#include "core/error.h"
#include "model/transformer.h"
#include "plan/memory_estimate.h"
#include "parallel/pipeline/schedule_builders.h"
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
  const TransformerLM meta(m, ModelStage{}, at::TensorOptions().device(at::kMeta));
  BlockWeights w;
  w.block.assign(m.n_layer, 0);
  for (const auto& item : meta->named_parameters()) {
    const std::string& name = item.key();
    const int64_t n = item.value().numel();
    if (name.rfind("h.", 0) == 0) w.block[std::stoll(name.substr(2, name.find('.', 2) - 2))] += n;
    else if (name.rfind("ln_f", 0) == 0) w.final_norm += n;
    else w.embedding += n;
    if (name == "wte.weight") w.wte = n;
  }
  return w;
}


}  // namespace

bool StageCut::even() const {
  for (int64_t s = 1; s < stages(); ++s)
    if (boundaries[s + 1] - boundaries[s] != boundaries[1] - boundaries[0]) return false;
  return true;
}

StageCut cut_stages(const ModelOptions& m, int64_t stages, const std::string& method) {
  require(stages >= 1 && stages <= m.n_layer, "parallel.pp x stages per rank = ", stages, " pipeline stages, but model.n_layer = ",
          m.n_layer, " blocks: every stage needs at least one block (lower parallel.pp or parallel.pp_virtual)");
  require(method == "layers" || method == "params", "parallel.pp_cut must be layers or params (got \"", method, "\")");
  const BlockWeights w = block_weights(m);
  const int64_t L = m.n_layer;
  StageCut cut;
  cut.method = method;
  if (method == "layers") {
    cut.boundaries.push_back(0);
    for (int64_t s = 0; s < stages; ++s) cut.boundaries.push_back(cut.boundaries.back() + L / stages + (s < L % stages ? 1 : 0));
  } else {
    // best[s][b]: for stages 0..s-1 holding blocks [0, b), the smallest largest stage and, among
    // the cuts reaching it, the smallest sum of squared stage sizes (the most even).
    using Cost = std::pair<int64_t, double>;
    const Cost none{std::numeric_limits<int64_t>::max(), 0};
    std::vector<std::vector<Cost>> best(stages + 1, std::vector<Cost>(L + 1, none));
    std::vector<std::vector<int64_t>> from(stages + 1, std::vector<int64_t>(L + 1, -1));
    best[0][0] = {0, 0};
    for (int64_t s = 1; s <= stages; ++s)
      for (int64_t b = s; b <= L - (stages - s); ++b)
        for (int64_t a = s - 1; a < b; ++a) {
          if (best[s - 1][a] == none) continue;
          const int64_t w_stage = stage_weight(w, s - 1, stages, a, b);
          const Cost value{std::max(best[s - 1][a].first, w_stage),
                           best[s - 1][a].second + static_cast<double>(w_stage) * static_cast<double>(w_stage)};
          if (value < best[s][b]) {
            best[s][b] = value;
            from[s][b] = a;
          }
        }
    cut.boundaries.assign(stages + 1, L);
    for (int64_t s = stages; s > 0; --s) cut.boundaries[s - 1] = from[s][cut.boundaries[s]];
    cut.boundaries[0] = 0;
  }
  for (int64_t s = 0; s < stages; ++s)
    cut.parameters.push_back(stage_weight(w, s, stages, cut.boundaries[s], cut.boundaries[s + 1]));
  return cut;
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
    std::snprintf(text, sizeof text, "  stage %lld: %s%s%s (%s parameters)\n", static_cast<long long>(s),
                  blocks.c_str(), s == 0 ? " + embedding" : "", s == cut.stages() - 1 ? " + head" : "",
                  format_count(cut.parameters[s]).c_str());
    out += text;
  }
  if (!cut.even())
    out += "  (the blocks do not divide evenly into " + std::to_string(cut.stages()) + " stages: the cut above is " +
           (cut.method == "layers"   ? std::string("as even as it can be, no block dropped")
            : cut.method == "params" ? std::string("balanced by parameters, no block dropped")
                                     : std::string("parallel.pp_layers, by hand")) + ")\n";
  return out;
}

pipeline::Schedule pipeline_schedule(const Config& config, const ParallelDims& dims, pipeline::Gathers gathers) {
  const ParallelOptions& p = config.parallel;
  const int64_t v = p.pipeline_virtual(), m = config.train.accumulation(dims.dp());
  pipeline::Schedule s =
      p.pp_schedule.rfind("file:", 0) == 0
          ? pipeline::read_schedule_csv(p.pp_schedule.substr(5), dims.pp(), v, m, pipeline::Placement::loop)
          : pipeline::build_schedule(p.pp_schedule, dims.pp(), m, v);
  pipeline::add_parameter_actions(s, gathers);
  pipeline::validate_schedule(s);
  return s;
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
