// What the planner's tests share: a small config and the breakdown of a prediction.
#pragma once

#include <string>

#include <gtest/gtest.h>

#include "config/config.h"
#include "plan/cost_model.h"
#include "tiny_config.h"

namespace tessera::test {

// A cluster of 4-device nodes whose numbers are round (a test computes its prices by hand).
inline const char* const kPlannerCluster = R"(
[cluster]
devices_per_node = 4
[device]
name = "test device"
peak_tflops_bf16 = 100
peak_tflops_fp32 = 20
matmul_tflops_bf16 = 80
matmul_tflops_fp32 = 16
memory_gib = 16
memory_gbs = 1000
[intra_node]
bandwidth_gbs = 100
latency_us = 5
[inter_node]
bandwidth_gbs = 10
latency_us = 20
)";

// 4 blocks of width 32, micro-batches of 2 x 64 tokens, 4 per step.
inline Config planner_config() {
  Config c = tiny_config(64);
  c.model.n_layer = 4;
  c.train.batch_size = 2;
  c.train.grad_accum = 4;
  return c;
}

// The sum of a prediction's breakdown (its step, when the parts add up).
inline double breakdown_sum(const plan::Prediction& p) {
  double total = 0;
  for (const auto& [name, seconds] : p.breakdown) total += seconds;
  return total;
}

// One term of a prediction's breakdown (a failure is recorded when it has none of that name).
inline double breakdown_term(const plan::Prediction& p, const std::string& name) {
  for (const auto& [key, seconds] : p.breakdown)
    if (key == name) return seconds;
  ADD_FAILURE() << "no breakdown term " << name;
  return 0;
}

}  // namespace tessera::test
