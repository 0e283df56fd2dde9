// libFuzzer target: a pipeline schedule table from a `file:` CSV (parallel/pipeline/schedule.h),
// then what a training run does with one: its parameter actions added, the validator (which
// replays it to find deadlocks) and the simulator. The first three bytes choose pp (1-4), the
// stages per rank (1-2), the micro-batches (1-8) and the placement; the rest is the file. Every
// input must either pass or end in tessera::Error.
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>

#include "core/error.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/simulate.h"
#include "parallel/pipeline/validate.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  using namespace tessera::pipeline;
  const int64_t pp = 1 + data[0] % 4, v = 1 + data[1] % 2, m = 1 + data[2] % 8;
  const Placement placement = v == 2 && (data[1] & 2) ? Placement::vee : Placement::loop;
  std::istringstream in(std::string(reinterpret_cast<const char*>(data) + 3, size - 3));
  try {
    Schedule s = read_schedule_csv(in, "fuzz.csv", pp, v, m, placement);
    validate_schedule(s);
    add_parameter_actions(s, (data[2] & 8) ? Gathers::per_action : Gathers::per_step);
    validate_schedule(s);
    simulate_schedule(s);
  } catch (const tessera::Error&) {
  }
  return 0;
}
