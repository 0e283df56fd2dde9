// The memory a training process held at its most (peak_memory.h).
#include "train/peak_memory.h"

#include <sys/resource.h>

#include <c10/core/CachingDeviceAllocator.h>

namespace tessera {

double take_peak_memory_gib(const c10::Device& device) {
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  if (device.is_cuda()) {
    c10::DeviceAllocator* allocator = c10::getDeviceAllocator(c10::DeviceType::CUDA);
    const double peak = static_cast<double>(allocator->getDeviceStats(device.index()).allocated_bytes[0].peak);
    allocator->resetPeakStats(device.index());
    return peak / kGiB;
  }
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) * 1024.0 / kGiB;  // ru_maxrss is in KiB on Linux
}

}  // namespace tessera
