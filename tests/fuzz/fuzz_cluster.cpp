// libFuzzer target: a cluster file as a user gives `tessera plan --cluster` or
// `train.plan_cluster` (plan/cluster.h, parse_cluster), and the same bytes as the product-rate
// table such a file may name (plan/matmul_table.h). Every input must load or end in
// tessera::Error; a file that loads has achievable rates no higher than its peaks, and every
// group of the first nodes is priced on a tier with a positive bandwidth; a table that loads
// prices every shape at a positive, finite rate.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "plan/cluster.h"
#include "plan/matmul_table.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const tessera::plan::MatmulTable table = tessera::plan::MatmulTable::parse(text, "fuzz.csv");
    for (const double d : {1.0, 300.0, 1e9}) {
      const double rate = table.tflops(d, 2 * d, d / 2);
      if (!(rate > 0) || !std::isfinite(rate)) __builtin_trap();
    }
  } catch (const tessera::Error&) {
  }
  tessera::plan::Cluster c;
  try {
    c = tessera::plan::parse_cluster(text, "fuzz.toml");
  } catch (const tessera::Error&) {
    return 0;
  }
  if (c.device.matmul_tflops_bf16 > c.device.peak_tflops_bf16 || c.device.matmul_tflops_fp32 > c.device.peak_tflops_fp32)
    __builtin_trap();
  for (int64_t n : {1, 2, 3, 16}) {
    std::vector<int64_t> members;
    for (int64_t r = 0; r < n; ++r) members.push_back(r * 3);
    if (!(c.tier(members).bandwidth_bytes_per_s > 0)) __builtin_trap();
    if (!(c.cluster.slowdown(n) >= 1)) __builtin_trap();
  }
  return 0;
}
