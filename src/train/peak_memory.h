// The memory a training process held at its most, for metrics.jsonl's peak_memory_gib (and so
// TensorBoard's curve of it).
#pragma once

#include <c10/core/Device.h>

namespace tessera {

// On CUDA: the most bytes the caching allocator had allocated on `device` since the last call (the
// peak is reset after each reading). On the CPU: the process's peak resident set size since it
// started (getrusage), which only grows. In GiB.
double take_peak_memory_gib(const c10::Device& device);

}  // namespace tessera
