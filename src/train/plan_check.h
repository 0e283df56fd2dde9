// train.plan_cluster: the planner's prediction for this run's own layout (plan/cost_model.h) on
// the named cluster, printed at start, and the run's measured step beside it after step
// kCheckedAtStep (the median of its last three steps: the first steps warm up, and a pipeline
// rebuilds its table after step 2), also in metrics.jsonl ("plan": predicted and measured
// seconds), with a warning when they differ by more than 15%. A layout the cost model does not
// model is said so at start and not checked; a cluster file that cannot be read is refused (the
// config's key named) before training starts.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/config.h"
#include "core/parallel_dims.h"

namespace tessera {

class PlanCheck {
 public:
  static constexpr int64_t kCheckedAtStep = 5;
  static constexpr double kTolerance = 0.15;

  PlanCheck(const Config& config, const ParallelDims& dims);
  // What the start prints ("" without train.plan_cluster).
  const std::string& start_note() const { return start_note_; }
  // Each optimizer step's seconds: at kCheckedAtStep the note to print, and the "plan" object
  // for the next metrics line.
  std::optional<std::string> after_step(int64_t step, double seconds);
  std::optional<nlohmann::json> take_metrics();

 private:
  std::optional<double> predicted_s_;
  std::string start_note_;
  std::vector<double> seconds_;
  std::optional<nlohmann::json> metrics_;
};

}  // namespace tessera
