#include "train/plan_check.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/error.h"
#include "plan/cluster.h"
#include "plan/cost_model.h"

namespace tessera {

PlanCheck::PlanCheck(const Config& config, const ParallelDims& dims) {
  if (config.train.plan_cluster.empty()) return;
  plan::Cluster cluster;
  try {
    cluster = plan::load_cluster(config.train.plan_cluster);
  } catch (const Error& e) {
    fail("train.plan_cluster: ", e.what());
  }
  try {
    const plan::Prediction p = plan::predict_time(config, dims, cluster);
    predicted_s_ = p.step_s;
    char line[300];
    std::snprintf(line, sizeof line,
                  "plan: on %s the planner predicts %.1f ms per step (%.0f tokens/s, MFU %.1f%%); the measured step "
                  "is compared after step %lld",
                  cluster.source.c_str(), 1000 * p.step_s, p.tokens_per_s, 100 * p.mfu,
                  static_cast<long long>(kCheckedAtStep));
    start_note_ = line;
  } catch (const Error& e) {
    start_note_ = std::string("plan: this layout is not predicted: ") + e.what();
  }
}

std::optional<std::string> PlanCheck::after_step(int64_t step, double seconds) {
  if (!predicted_s_ || step > kCheckedAtStep) return std::nullopt;
  seconds_.push_back(seconds);
  if (step < kCheckedAtStep) return std::nullopt;
  std::vector<double> last(seconds_.end() - std::min<std::ptrdiff_t>(3, static_cast<std::ptrdiff_t>(seconds_.size())),
                           seconds_.end());
  std::sort(last.begin(), last.end());
  const double measured = last[last.size() / 2];
  const double ratio = measured / *predicted_s_;
  metrics_ = nlohmann::json{{"predicted_step_s", *predicted_s_}, {"measured_step_s", measured}};
  char line[300];
  std::snprintf(line, sizeof line, "plan: step %lld measured %.1f ms against %.1f ms predicted (x%.2f)%s",
                static_cast<long long>(step), 1000 * measured, 1000 * *predicted_s_, ratio,
                std::abs(ratio - 1) > kTolerance ? "; more than 15% apart: recalibrate the cluster file "
                                                   "(`tessera plan calibrate`) or see docs/plan.md for what the "
                                                   "model leaves out"
                                                 : "");
  return std::string(line);
}

std::optional<nlohmann::json> PlanCheck::take_metrics() {
  std::optional<nlohmann::json> out;
  out.swap(metrics_);
  return out;
}

}  // namespace tessera
