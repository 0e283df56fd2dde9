// keep_host_heap(): the process's malloc settings for training. glibc hands the heap top back to
// the kernel whenever a step's activations are freed and faults it back in on the next step
// (15-25k page faults per tiny_gpt step; docs/benchmarks.md), and serves blocks above its dynamic
// threshold by mmap, each freed back to the kernel. After this call blocks up to 32 MiB come from
// a heap that is never trimmed: peak RSS is the step's peak anyway. Called by TrainStep and by the
// benchmark programs that time parts of a step outside it (bench/split_profile.cpp: without it a
// zero-bubble I that runs while earlier micro-batches' graphs are alive costs 30% more).
#pragma once

#ifdef __GLIBC__
#include <malloc.h>
#endif

namespace tessera {

inline void keep_host_heap() {
#ifdef __GLIBC__
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, -1);
#endif
}

}  // namespace tessera
