// train.device -> the device of this process (comm/device.h): one GPU per local rank.
#include "comm/device.h"

#include <cstdlib>
#include <optional>

#include <ATen/ATen.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/cuda.h>
#ifdef TESSERA_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

#include "core/error.h"

namespace tessera::comm {
namespace {

std::string where(const LaunchInfo& launch) {
  if (launch.world_size == 1) return "the single process";
  return "rank " + std::to_string(launch.rank) + " (local rank " + std::to_string(launch.local_rank) + " of " +
         std::to_string(launch.local_world_size) + " on its node)";
}

std::string visible_text(int64_t visible_gpus) {
  const char* mask = std::getenv("CUDA_VISIBLE_DEVICES");
  return std::to_string(visible_gpus) + " CUDA device" + (visible_gpus == 1 ? " is" : "s are") + " visible" +
         (mask ? std::string(" (CUDA_VISIBLE_DEVICES=") + mask + ")" : std::string());
}

}  // namespace

c10::Device resolve_device(const std::string& train_device, const LaunchInfo& launch, int64_t visible_gpus) {
  std::optional<c10::Device> parsed;
  try {
    parsed = c10::Device(train_device);
  } catch (const std::exception&) {
    fail("train.device = \"", train_device, "\" is not a device: use cpu, cuda or cuda:N");
  }
  const c10::Device device = *parsed;
  if (device.is_cpu()) return device;
  require(device.is_cuda(), "train.device = \"", train_device, "\": only cpu and cuda devices are supported");
  // A layout mistake is named before the hardware is looked at.
  require(!device.has_index() || launch.local_world_size == 1, "train.device = \"", train_device, "\" is given to all ",
          launch.local_world_size, " processes of this node (", where(launch),
          "): they would share one GPU; use train.device = \"cuda\", which gives local rank L cuda:L");
  require(visible_gpus > 0, "train.device = \"", train_device, "\" but no CUDA device is available to ",
          where(launch),
#ifdef TESSERA_WITH_CUDA
          ""
#else
          " (this build has TESSERA_CUDA=OFF)"
#endif
  );
  if (device.has_index()) {
    require(device.index() < visible_gpus, "train.device = \"", train_device, "\" for ", where(launch), ": only ",
            visible_text(visible_gpus));
    return device;
  }
  require(launch.local_rank < visible_gpus, "train.device = \"cuda\" for ", where(launch), " needs cuda:",
          launch.local_rank, " (one GPU per local rank) but only ", visible_text(visible_gpus),
          "; start at most one process per GPU on each node, every process seeing all of the node's GPUs");
  return c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(launch.local_rank));
}

c10::Device select_device(const std::string& train_device, const LaunchInfo& launch) {
  // A CPU run never asks the CUDA runtime anything.
  const bool wants_cuda = train_device.rfind("cuda", 0) == 0;
  const c10::Device device =
      resolve_device(train_device, launch, wants_cuda ? static_cast<int64_t>(torch::cuda::device_count()) : 0);
  if (device.is_cuda()) c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->setDevice(device);
  return device;
}

at::Tensor to_device_queued(const at::Tensor& t, const c10::Device& device) {
  if (!device.is_cuda() || !t.is_cpu()) return t.to(device);
  return t.contiguous().pin_memory().to(device, /*non_blocking=*/true);
}

double device_memory_bytes(const c10::Device& device) {
#ifdef TESSERA_WITH_CUDA
  if (device.is_cuda())
    return static_cast<double>(at::cuda::getDeviceProperties(device.has_index() ? device.index() : 0)->totalGlobalMem);
#endif
  (void)device;
  return 0;
}

}  // namespace tessera::comm
