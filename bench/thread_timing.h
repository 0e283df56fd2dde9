// What the benchmark programs time a part of a step with (bench/profile_step.cpp,
// bench/split_profile.cpp): the calling thread's CPU time, which with one intra-op thread is the
// part's own work, insensitive to other processes on a shared machine, and the median of a run's
// samples.
#pragma once

#include <time.h>

#include <algorithm>
#include <vector>

namespace tessera::bench {

inline double thread_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// The upper median of v (not empty).
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace tessera::bench
